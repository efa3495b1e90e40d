#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "batchtune/common/clock.h"
#include "batchtune/step/amp.h"
#include "batchtune/step/trial.h"
#include "batchtune/tuning/energy.h"
#include "batchtune/tuning/noise_run.h"
#include "batchtune/tuning/plan_request.h"
#include "batchtune/tuning/search.h"
#include "batchtune/tuning/sweep.h"

namespace batchtune {

class DataParallel;
class Dataset;
class Monitor;

// TORCH_ARG spells its setter's parameter `const T&`, so a pointer option
// names its type through an alias (as `ClockPointer` in clock.h).
using DatasetPointer = const Dataset*;
using DataParallelPointer = DataParallel*;
using MonitorPointer = Monitor*;

/// Shares of the time budget (`TuneOptions::time_budget_s`) that each phase
/// may spend. What a phase leaves unused is handed on to the next, so a
/// quick search leaves the sweep more time. The search decides the answer
/// that matters most (what fits) and the sweep the throughput choice; the
/// noise run and loader tuning refine the plan.
/// The precision phase (`amp auto` on a CPU) comes first and takes what it
/// needs of its share; elsewhere it takes nothing and hands its share on.
constexpr double kPrecisionBudgetShare = 0.10;
constexpr double kSearchBudgetShare = 0.30;
constexpr double kSweepBudgetShare = 0.30;
constexpr double kNoiseBudgetShare = 0.15;
constexpr double kLoaderBudgetShare = 0.10;
/// The evaluation batch's search: forward-only trials of one step each,
/// memory only (see `TuneResult::eval_search`).
constexpr double kEvalBudgetShare = 0.05;
/// A run ends within its budget plus this share (trials are sized to what
/// is left, the minimum warm-up and one timed step excepted); past it the
/// result's `budget_note` says why.
constexpr double kTimeBudgetTolerance = 0.05;
/// The least `--time-budget` taken: below it not even the precision and a
/// search of a few trials fit on a fast model.
constexpr double kMinTimeBudgetSeconds = 1;

/// Returns why to stop ("SIGINT"), or nullopt to go on. Asked before every
/// trial and between phases.
using StopRequest = std::function<std::optional<std::string>()>;

/// How a tune runs.
///
/// Example:
/// ```
///   auto memory = batchtune::make_device_memory(c10::kCPU, 512 << 20);
///   batchtune::Workload workload(batchtune::WorkloadOptions().model("lenet")
///                                    .input_shape({1, 28, 28}));
///   batchtune::TuneResult result = batchtune::tune(
///       workload, *memory, batchtune::TuneOptions().time_budget_s(60));
///   if (result.plan) std::cout << result.plan->micro_batch_size;
/// ```
struct TuneOptions {
  /// The search's strategy, cap and tolerance (its `time_budget_s` is set
  /// from this struct's `time_budget_s` and `kSearchBudgetShare`).
  TORCH_ARG(SearchOptions, search) = SearchOptions();
  /// Seconds for the whole run: search, sweep, noise run and loader tuning,
  /// each with its share (see `kSearchBudgetShare`). A trial that started
  /// runs to its end, so a run ends within the budget plus one trial.
  TORCH_ARG(double, time_budget_s) = kDefaultTimeBudgetSeconds;
  /// Share of the device's capacity kept free: fits = peak ≤ capacity × (1 −
  /// margin). The `TrialRunner` overload takes the runner's.
  TORCH_ARG(double, margin) = kDefaultMargin;
  /// Only search the largest batch that fits: no sweep, no plan.
  TORCH_ARG(bool, search_only) = false;
  /// False: no sweep, the plan at the largest batch that fits (the Python
  /// package's `sweep=False`); `search_only` makes no plan at all.
  TORCH_ARG(bool, sweep) = true;
  TORCH_ARG(Objective, objective) = Objective::kThroughput;
  /// Share of the best throughput within which the smallest batch is chosen.
  TORCH_ARG(double, tolerance) = kDefaultThroughputTolerance;
  /// Precision of every trial; `kAuto` is resolved first (`choose_amp`).
  TORCH_ARG(AmpMode, amp) = AmpMode::kAuto;
  /// `kEnergy`: the weight of energy against time in the Zeus cost.
  TORCH_ARG(double, eta) = kDefaultEta;
  /// `kGoodput`: optimizer steps of the noise-scale run.
  TORCH_ARG(int64_t, noise_steps) = kDefaultNoiseRunSteps;
  /// Real training data: the goodput objective's noise run and loader
  /// tuning train on it, and no micro-batch larger than it is tried.
  /// Null (or synthetic data) skips both, with a note.
  TORCH_ARG(DatasetPointer, data) = nullptr;
  /// Seeds the loader tuning's batches and the noise run.
  TORCH_ARG(uint64_t, seed) = 0;
  /// CPU cores, for the loader tuning's worker counts.
  TORCH_ARG(int64_t, cores) = 1;
  /// What the plan is asked to be (target batch, lr, warm-up...); its
  /// micro-batch and precision come from the tune.
  TORCH_ARG(PlanRequest, plan) = PlanRequest();
  /// Data parallel: every rank tunes its own device, the job takes the
  /// smallest rank's maximum and rank 0's plan. Null for one process.
  TORCH_ARG(DataParallelPointer, data_parallel) = nullptr;
  /// A running monitor of the device: utilization and energy per sweep row,
  /// and the timeline. Null for none.
  TORCH_ARG(MonitorPointer, monitor) = nullptr;
  /// The command line that asked for the run, for the report.
  TORCH_ARG(std::string, command_line) = "";
  /// Asked before every trial; a stop ends the run with what was measured
  /// (`complete == false`).
  TORCH_ARG(StopRequest, stop) = nullptr;
  /// The clock of the time budget (a fake in tests); null for the steady clock.
  TORCH_ARG(ClockPointer, clock) = nullptr;
  /// Who reads the result: its reasons and notes name options as this front
  /// end does (`--max-batch` on the command line, `max_batch` from Python).
  /// `resolve` hands it to the search and the plan request.
  TORCH_ARG(FrontEnd, front_end) = FrontEnd::kCli;
};

/// Options checked and completed, the only ones the pipeline takes: made by
/// `resolve`, read through `->`.
class ResolvedTuneOptions {
 public:
  const TuneOptions& operator*() const { return options_; }
  const TuneOptions* operator->() const { return &options_; }

  /// What a run works with, wired after resolving (nothing in these is an
  /// option to check but the monitor's sampler: it must read energy for the
  /// energy objective).
  ResolvedTuneOptions& stop(StopRequest value);
  ResolvedTuneOptions& data_parallel(DataParallel* value);
  ResolvedTuneOptions& data(const Dataset* value);
  ResolvedTuneOptions& monitor(Monitor* value);
  ResolvedTuneOptions& clock(Clock* value);

 private:
  friend ResolvedTuneOptions resolve(const TuneOptions& options);
  explicit ResolvedTuneOptions(TuneOptions options) : options_(std::move(options)) {}
  TuneOptions options_;
};

/// Checks every option once, before any trial — the time budget, tolerance,
/// eta, noise steps, margin, the search's (max batch, tolerance) and the plan
/// request's; with a monitor, that energy can be read for the energy
/// objective — and completes them: the plan request's precision becomes the
/// one `amp` (the request's is cleared), and the search and the plan request
/// take the options' `front_end`. Throws `batchtune::OptionError`
/// naming the option.
///
/// Example:
/// ```
///   const batchtune::ResolvedTuneOptions options =
///       batchtune::resolve(batchtune::TuneOptions().time_budget_s(60));
///   batchtune::tune(subject, *memory, options);
/// ```
ResolvedTuneOptions resolve(const TuneOptions& options);

/// `resolve` for its checks alone.
void validate(const TuneOptions& options);

/// The objective `--objective auto` stands for: goodput where there is real
/// training data to measure the noise scale on (`real_data`: samples read
/// from files, not synthetic ones, and not text, whose global batch is a
/// token budget) and the global batch is free (no `target_batch`); else
/// throughput. On Fashion-MNIST the goodput plan reached 85 % test accuracy
/// as soon as a fixed batch of 64, the throughput plan with 1.6x the samples
/// (bench/time_to_accuracy.py, docs/benchmarks.md).
Objective auto_objective(bool real_data, const PlanRequest& request);

/// What `batchtune train` runs when given neither `--batch-size` nor
/// `--plan`: a tune of at most `kQuickTuneTimeBudgetSeconds`, no larger than
/// `max_batch`, with the objective `tune` takes by default. With `data`
/// (the training data, not synthetic) that is goodput, its noise run and
/// the loader tuning on `data`: the plan `tune --data` would give, so that
/// training starts where `--adapt` would steer it; without, throughput.
constexpr double kQuickTuneTimeBudgetSeconds = 60;
TuneOptions quick_tune_options(const PlanRequest& request, int64_t max_batch,
                               const Dataset* data = nullptr);

}  // namespace batchtune
