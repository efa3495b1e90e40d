#pragma once

// The tune: one pipeline over a subject. Its parts, one idea a header:
// the options and their resolution (tune_options.h), the result
// (tune_result.h), the reporter (tune_reporter.h), the subject and its
// adapters (tune_subject.h), and the plan to train with (resolve_plan.h).
#include "batchtune/tuning/resolve_plan.h"
#include "batchtune/tuning/tune_options.h"
#include "batchtune/tuning/tune_reporter.h"
#include "batchtune/tuning/tune_result.h"
#include "batchtune/tuning/tune_subject.h"

namespace batchtune {

class DeviceMemory;
class Workload;

/// The pipeline: precision, then the search for the largest micro-batch that
/// fits, the lengths (a length range), the sweep for the fastest, the
/// objective (the noise run for goodput), the evaluation batch, and the plan
/// with loader tuning — every trial running `subject`'s runner at the
/// resolved precision. Leaves the subject as it was. Throws
/// `batchtune::OptionError` when not even batch size 1 fits, and
/// `batchtune::Error` when a trial fails for another reason than its size.
///
/// Example:
/// ```
///   auto memory = batchtune::make_device_memory(c10::kCPU, 512 << 20);
///   batchtune::Workload workload(batchtune::WorkloadOptions().model("lenet")
///                                    .input_shape({1, 28, 28}));
///   const auto options = batchtune::resolve(batchtune::TuneOptions().time_budget_s(60));
///   batchtune::WorkloadSubject subject(workload, *memory, options->margin());
///   batchtune::TuneResult result = batchtune::tune(subject, *memory, options);
///   if (result.plan) std::cout << result.plan->micro_batch_size;
/// ```
TuneResult tune(TuneSubject& subject, DeviceMemory& memory, const ResolvedTuneOptions& options,
                TuneReporter* reporter = nullptr);

/// The same, the options resolved first (`resolve`).
TuneResult tune(TuneSubject& subject, DeviceMemory& memory, const TuneOptions& options,
                TuneReporter* reporter = nullptr);

/// The pipeline over a `Workload` (its `WorkloadSubject`).
TuneResult tune(Workload& workload, DeviceMemory& memory, const TuneOptions& options,
                TuneReporter* reporter = nullptr);

using RunnerAt = RunnerSubject::RunnerAt;

/// The pipeline over runners of one subject, one per precision
/// (a `RunnerSubject`): no noise run, no loader tuning, no workload in the plan.
TuneResult tune(const RunnerAt& runner_at, DeviceMemory& memory, const TuneOptions& options,
                TuneReporter* reporter = nullptr);

/// The same over one runner: the precision and margin are the runner's.
TuneResult tune(TrialRunner& runner, const TuneOptions& options, TuneReporter* reporter = nullptr);

}  // namespace batchtune
