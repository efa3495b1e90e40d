#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/tuning/energy.h"
#include "batchtune/plan/plan.h"
#include "batchtune/step/amp.h"
#include "batchtune/step/trial.h"
#include "batchtune/tuning/goodput.h"
#include "batchtune/tuning/loader_tuning.h"
#include "batchtune/tuning/noise_run.h"
#include "batchtune/tuning/plan_request.h"
#include "batchtune/tuning/search.h"
#include "batchtune/tuning/sweep.h"
#include "batchtune/tuning/token_budget.h"

namespace batchtune {

class DataParallel;
class Dataset;
class DeviceMemory;
class Monitor;
class Workload;

/// The phases of a tune, in order. `kLengths` runs only for a length range
/// (`int64:16..512`): the memory model over batch and length, and the token
/// budget (see `plan_token_budget`).
enum class TunePhase { kPrecision, kSearch, kLengths, kSweep, kNoise, kEval, kLoader, kPlan };
std::string to_string(TunePhase phase);

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

/// One reading of device utilization during the run, for the timeline plot.
struct UtilizationPoint {
  double seconds = 0;  ///< since the run started
  std::optional<double> utilization;
};

/// What ran from `start_s` to `end_s` (seconds since the run started): a
/// search or sweep trial at `batch_size`, for the utilization plot.
struct TimelinePhase {
  double start_s = 0;
  double end_s = 0;
  int64_t batch_size = 0;
  std::string stage;  ///< "precision", "search", "sweep"
};

/// Everything a tune found, as plain data; the console table, the JSON
/// (`to_json`, exactly what `batchtune tune --json` writes) and the HTML
/// report are views of it.
struct TuneResult {
  std::string workload;  ///< "resnet18 (11181642 parameters)"
  std::string device;    ///< "cpu", "cuda:0"
  int threads = 0;
  /// The precision every trial and sweep row ran at, and why.
  AmpMode amp = AmpMode::kOff;
  std::string amp_reason;
  /// The level the precision's measurement reached (1 where nothing was
  /// measured); nullopt: inconclusive, fp32 kept.
  std::optional<double> amp_confidence = 1.0;
  SearchResult search;
  /// Data parallel: this rank's own largest batch (the search's is the job's,
  /// the smallest rank's).
  std::optional<int64_t> rank_max_batch_size;
  std::vector<SweepRow> sweep;
  /// The largest evaluation batch: the same search over forward-only
  /// trials (no gradients, no optimizer state, the model in eval mode), as
  /// Lightning's finder sizes its validation loaders; nullopt where it did
  /// not run (search only, a subject without a forward-only step).
  std::optional<SearchResult> eval_search;
  Objective objective = Objective::kThroughput;
  Selection selection;
  Diagnosis diagnosis;
  int64_t capacity_bytes = 0;
  int64_t usable_bytes = 0;
  double margin = 0;
  std::vector<UtilizationPoint> timeline;
  /// Which trial ran when, on the same clock as `timeline`.
  std::vector<TimelinePhase> phases;
  /// The command line that made the run, for the report; empty: not shown.
  std::string command_line;
  /// When the report was made ("2026-12-01 20:45 UTC"); empty: now.
  std::string generated_at;
  /// How utilization was read, in one short line, and what is missing.
  std::string utilization_note;
  /// The same with every reason a reading is unavailable (NVML's and RAPL's
  /// errors in full).
  std::string utilization_details;
  /// False when the run was stopped (an interrupt) before it finished:
  /// what was measured until then is kept.
  bool complete = true;
  /// Why it stopped early ("SIGINT"); empty when complete.
  std::string interrupted_by;
  /// Only the search ran (`TuneOptions::search_only`).
  bool search_only = false;
  /// The time budget of the whole run, and what each phase spent.
  double time_budget_s = 0;
  std::vector<std::pair<TunePhase, double>> phase_seconds;
  /// Why the run took longer than its budget (plus `kTimeBudgetTolerance`);
  /// empty when it did not.
  std::string budget_note;
  /// `--objective goodput`: the noise-scale run, on what data, the base
  /// batch B0 of the efficiency, every candidate global batch and the choice.
  std::optional<NoiseScaleMeasurement> noise;
  std::string noise_data;
  int64_t goodput_base_batch = 0;
  std::vector<GoodputCandidate> goodput;
  std::optional<GoodputCandidate> goodput_choice;
  /// "energy per sample unavailable, because …" where a row has no energy
  /// reading; empty when every row has one.
  std::string energy_note;
  /// `--objective energy`: η and the Zeus cost of each row with a reading.
  double eta = kDefaultEta;
  std::vector<EnergyCost> energy_costs;
  /// The input pipeline, timed on the data at the chosen micro-batch.
  LoaderTuning loader;
  /// A length range: the memory model over batch and length, its checks,
  /// and the token budget and buckets it planned. None for fixed shapes.
  std::optional<TokenBudgetResult> tokens;
  /// The plan to train with; none for a search only, or when nothing fits.
  std::optional<Plan> plan;
};

/// What a tune reports as it goes: each phase as it starts, each trial as it
/// finishes. Console, JSON and HTML reporters implement it; so can a test or
/// the Python package.
class TuneReporter {
 public:
  virtual ~TuneReporter() = default;
  /// A phase begins; `what` says what it will do ("timing 8 batch sizes up to 200").
  virtual void phase_started(TunePhase phase, const std::string& what) {
    (void)phase;
    (void)what;
  }
  /// A trial at `batch_size` is about to run.
  virtual void trial_started(TunePhase phase, int64_t batch_size) {
    (void)phase;
    (void)batch_size;
  }
  /// A trial ended; `index` counts the phase's trials from 0.
  virtual void trial_finished(TunePhase phase, const TrialResult& trial, size_t index) {
    (void)phase;
    (void)trial;
    (void)index;
  }
  /// A phase ended; `result` holds what it found.
  virtual void phase_finished(TunePhase phase, const TuneResult& result) {
    (void)phase;
    (void)result;
  }
  /// The run ended (complete or not).
  virtual void finished(const TuneResult& result) { (void)result; }
};

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
 public:
  TuneOptions& data(const Dataset* value) {
    data_ = value;
    return *this;
  }
  const Dataset* data() const { return data_; }
  /// Seeds the loader tuning's batches and the noise run.
  TORCH_ARG(uint64_t, seed) = 0;
  /// CPU cores, for the loader tuning's worker counts.
  TORCH_ARG(int64_t, cores) = 1;
  /// What the plan is asked to be (target batch, lr, warm-up...); its
  /// micro-batch and precision come from the tune.
  TORCH_ARG(PlanRequest, plan) = PlanRequest();
  /// Data parallel: every rank tunes its own device, the job takes the
  /// smallest rank's maximum and rank 0's plan. Null for one process.
 public:
  TuneOptions& data_parallel(DataParallel* value) {
    data_parallel_ = value;
    return *this;
  }
  DataParallel* data_parallel() const { return data_parallel_; }
  /// A running monitor of the device: utilization and energy per sweep row,
  /// and the timeline. Null for none.
 public:
  TuneOptions& monitor(Monitor* value) {
    monitor_ = value;
    return *this;
  }
  Monitor* monitor() const { return monitor_; }
  /// The command line that asked for the run, for the report.
  TORCH_ARG(std::string, command_line) = "";
  /// Asked before every trial; a stop ends the run with what was measured
  /// (`complete == false`).
  TORCH_ARG(StopRequest, stop) = nullptr;
  /// The clock of the time budget (a fake in tests); null for the steady clock.
 public:
  TuneOptions& clock(Clock* value) {
    clock_ = value;
    return *this;
  }
  Clock* clock() const { return clock_; }

 private:
  const Dataset* data_ = nullptr;
  DataParallel* data_parallel_ = nullptr;
  Monitor* monitor_ = nullptr;
  Clock* clock_ = nullptr;
};

/// Checks the options for range (time budget, tolerance, eta, noise steps,
/// margin, max batch, the plan request; with a monitor, that energy can be
/// read for the energy objective). Throws `batchtune::Error` naming the
/// option. `tune` calls it first; a caller may call it before printing
/// anything.
void validate(const TuneOptions& options);

/// The pipeline: precision, then the search for the largest micro-batch that
/// fits, the sweep for the fastest, the objective, the noise run (goodput),
/// loader tuning (with data), and the plan — every trial running
/// `workload`'s training step at the resolved precision. Leaves the workload
/// as it was. Throws `batchtune::Error` for bad options, when not even batch
/// size 1 fits, or when a trial fails for another reason than its size.
TuneResult tune(Workload& workload, DeviceMemory& memory, const TuneOptions& options,
                TuneReporter* reporter = nullptr);

/// Trial runners of one subject, one for each precision the pipeline may
/// pick (`kOff`, `kBf16`, `kFp16`); each must outlive the tune.
using RunnerAt = std::function<TrialRunner&(AmpMode)>;

/// The pipeline over any subject (the Python package's model), its
/// precision resolved first from `options.amp()` as for a workload:
/// `runner_at(amp)` gives the runner of each precision it measures or picks.
/// Without a `workload` the noise run and loader tuning are skipped (with a
/// note), and the plan records no workload.
TuneResult tune(const RunnerAt& runner_at, DeviceMemory& memory, const TuneOptions& options,
                TuneReporter* reporter = nullptr, Workload* workload = nullptr);

/// The same over trials of one runner: the precision is the subject's. Without a `workload`
/// the noise run and loader tuning are skipped (with a note), and the plan
/// records no workload.
TuneResult tune(TrialRunner& runner, const TuneOptions& options, TuneReporter* reporter = nullptr,
                Workload* workload = nullptr);

/// What `batchtune train` runs when given neither `--batch-size` nor
/// `--plan`: a tune of at most `kQuickTuneTimeBudgetSeconds` with the
/// throughput objective, no noise run, no loader tuning.
constexpr double kQuickTuneTimeBudgetSeconds = 60;
TuneOptions quick_tune_options(const PlanRequest& request, int64_t max_batch);

/// The plan to train `workload` with, as `request` asks: its plan file
/// (checked against the workload, the request's fields overriding the
/// file's), or its micro-batch, or — with neither — a quick tune
/// (`quick_tune_options`, reported to `reporter`, agreed over ranks by
/// `data_parallel`). Throws `batchtune::Error` naming the field, and
/// `batchtune::Interrupted` when `stop` ended the quick tune.
Plan resolve_plan(const PlanRequest& request, Workload& workload, DeviceMemory& memory,
                  int64_t max_batch = kDefaultMaxBatch, TuneReporter* reporter = nullptr,
                  DataParallel* data_parallel = nullptr, StopRequest stop = nullptr);

}  // namespace batchtune
