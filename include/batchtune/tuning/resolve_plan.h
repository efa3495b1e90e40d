#pragma once

#include <cstdint>
#include <vector>

#include "batchtune/plan/plan.h"
#include "batchtune/tuning/plan_request.h"
#include "batchtune/tuning/search.h"
#include "batchtune/tuning/sweep.h"
#include "batchtune/tuning/tune_options.h"
#include "batchtune/tuning/tune_reporter.h"

namespace batchtune {

class DataParallel;
class Dataset;
class DeviceMemory;
class Workload;

/// The plan to train `workload` with, as `request` asks: its plan file
/// (checked against the workload, the request's fields overriding the
/// file's), or its micro-batch, or — with neither — a quick tune
/// (`quick_tune_options` on the training data `data` where there is one,
/// reported to `reporter`, agreed over ranks by `data_parallel`). Throws
/// `batchtune::Error` naming the field, and `batchtune::Interrupted` when
/// `stop` ended the quick tune. `sweep`, where given, receives the quick
/// tune's sweep (the throughput of each micro-batch it timed; left empty
/// where no tune ran), which `train --adapt` starts from.
Plan resolve_plan(const PlanRequest& request, Workload& workload, DeviceMemory& memory,
                  int64_t max_batch = kDefaultMaxBatch, TuneReporter* reporter = nullptr,
                  DataParallel* data_parallel = nullptr, StopRequest stop = nullptr,
                  const Dataset* data = nullptr, std::vector<SweepRow>* sweep = nullptr);

}  // namespace batchtune
