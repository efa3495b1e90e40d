#pragma once

#include <cstdint>
#include <string>

#include "batchtune/tuning/search.h"
#include "batchtune/tuning/sweep.h"

namespace batchtune {

class DeviceMemory;
class Workload;

/// The search time budget of a quick tune: `train` should start training
/// soon, so it spends at most this long finding the micro-batch.
constexpr double kQuickTuneTimeBudgetSeconds = 60;

/// A micro-batch found by a quick tune, and why.
struct TunedBatch {
  int64_t batch_size = 0;
  std::string reason;
  SearchResult search;
  std::vector<SweepRow> sweep;
};

/// What `batchtune train` runs when given neither `--batch-size` nor
/// `--plan`: the `predict` search (within `kQuickTuneTimeBudgetSeconds`, at
/// most `max_batch`), the sweep up to the maximum, and the throughput choice.
/// Throws `batchtune::Error` when not even batch size 1 fits.
///
/// Example:
/// ```
///   batchtune::TunedBatch tuned = batchtune::quick_tune(workload, *memory, 60000);
///   auto plan = batchtune::make_plan(options.micro_batch_size(tuned.batch_size));
/// ```
TunedBatch quick_tune(Workload& workload, DeviceMemory& memory, int64_t max_batch);

}  // namespace batchtune
