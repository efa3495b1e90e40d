#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/common/clock.h"
#include "batchtune/data/dataset.h"
#include "batchtune/distributed/data_parallel.h"
#include "batchtune/plan/plan.h"
#include "batchtune/step/training_step.h"
#include "batchtune/training/batch_adapter.h"
#include "batchtune/training/step_source.h"
#include "batchtune/training/loss_target.h"
#include "batchtune/training/loss_watch.h"

namespace batchtune {

struct AdaptCheckpoint;
class DeviceMemory;
class Workload;
struct RunIdentity;

/// How long a run trains and what it writes on the way.
struct TrainOptions {
  /// Passes over the training set (when `steps` is 0).
  TORCH_ARG(int64_t, epochs) = 1;
  /// Optimizer steps to run in all, across epochs; 0 for `epochs`.
  TORCH_ARG(int64_t, steps) = 0;
  /// Seeds the shuffling: epoch e visits the samples in a permutation drawn
  /// from (seed, e), so a resumed run sees the same order.
  TORCH_ARG(uint64_t, seed) = 0;
  /// A log event every this many optimizer steps; 0 for none.
  TORCH_ARG(int64_t, log_every) = 0;
  /// Progress events (for a progress bar) at most this often; 0 for none.
  TORCH_ARG(double, progress_interval_s) = 0.0;
  /// Directory of `checkpoint.pt`; empty for no checkpoints.
  TORCH_ARG(std::string, checkpoint_dir) = "";
  /// A checkpoint every this many optimizer steps (and always at the end);
  /// 0 for the end only.
  TORCH_ARG(int64_t, checkpoint_every) = 0;
  /// Continue from the checkpoint in `checkpoint_dir` when there is one.
  TORCH_ARG(bool, resume) = false;
  /// Test-set evaluation batch; 0 for the micro-batch.
  TORCH_ARG(int64_t, eval_batch_size) = 0;
  /// Measure the gradient noise scale (see `NoiseScaleTracker::small_batch`).
  TORCH_ARG(bool, measure_noise_scale) = true;
  /// Evaluate the test split every this many optimizer steps as well as at
  /// each epoch's end; 0 for epoch ends only.
  TORCH_ARG(int64_t, eval_every) = 0;
  /// Evaluate every this many training samples instead (whatever the batch:
  /// with `adapt` a step count would evaluate less often as the batch grows);
  /// 0 for none. Not with `eval_every`.
  TORCH_ARG(int64_t, eval_every_samples) = 0;
  /// Stop as soon as an evaluation reaches this test accuracy, a fraction in
  /// (0, 1]; needs a test split. nullopt trains the steps or epochs out.
  TORCH_ARG(std::optional<double>, target_accuracy) = std::nullopt;
  /// Stop as soon as the mean training loss over the last `loss_window`
  /// optimizer steps is at or below this positive loss (see `LossTarget`);
  /// nullopt trains the steps or epochs out. One target a run: not with
  /// `target_accuracy`. Each step's loss is then read as it ends, which
  /// waits for the device once a step.
  TORCH_ARG(std::optional<double>, target_loss) = std::nullopt;
  /// Optimizer steps in the moving mean `target_loss` is checked against: a
  /// few, so that one lucky batch does not end the run.
  TORCH_ARG(int64_t, loss_window) = 10;
  /// Stop after the optimizer step at which this many seconds of training
  /// time (read from the trainer's clock) have passed; 0 for no limit. A run
  /// so stopped is complete, with `time_limit_reached` set.
  TORCH_ARG(double, time_limit_s) = 0.0;
  /// The clock training time, waits for data and `time_limit_s` are read on
  /// (a fake in tests); null for the steady clock. It must outlive the run.
  TORCH_ARG(ClockPointer, clock) = nullptr;
  /// Adapt the global batch and lr to the gradient noise scale as training
  /// goes (see `BatchAdapter`): the plan's global batch and lr are where it
  /// starts. Needs `measure_noise_scale`.
  TORCH_ARG(bool, adapt) = false;
  TORCH_ARG(AdaptOptions, adapt_options) = {};
};

/// Refuses (`OptionError` about `--target-accuracy`) an accuracy outside
/// (0, 1]; one given as a percent (2 to 100) is told its fraction.
///
/// Example:
/// ```
///   batchtune::check_target_accuracy(85);  // "... got 85 (for 85 % give 0.85)"
/// ```
void check_target_accuracy(double fraction);

/// A goal that ends training early: `metric` reaching `value`.
struct TrainTarget {
  /// "test_accuracy" (reached at or above `value`) or "train_loss" (at or below).
  std::string metric;
  double value = 0;
};

/// What the training loop reports as it goes. Plain data: a console
/// reporter, a JSON log or a test consume it.
struct TrainEvent {
  enum class Kind {
    kProgress,     ///< for a progress bar, every `progress_interval_s`
    kLog,          ///< every `log_every` steps
    kEpochEnd,     ///< an epoch finished; `test_accuracy` set with a test split
    kEvaluation,   ///< an `eval_every` evaluation between epoch ends; `test_accuracy` set
    kTargetReached,  ///< the target was reached: training stops; `message` says so
    kOomRecovery,  ///< out of memory: the micro-batch was halved; `message` says so
    kCheckpoint,   ///< a checkpoint was written; `message` names it
    kResumed,      ///< the run continues from a checkpoint (or, with none yet, starts afresh)
    kBatchChange,  ///< `--adapt` changed the global batch; `message` says why
    /// The loss is not finite, or flat from the start (see `LossWatch`):
    /// `message` says so and names the likely cause; once per kind.
    kDivergence,
  };
  Kind kind = Kind::kProgress;
  int64_t step = 0;         ///< optimizer steps done
  int64_t total_steps = 0;
  int64_t epoch = 0;        ///< current epoch, from 0
  int64_t epochs = 0;       ///< epochs the run will touch
  double loss = 0;          ///< mean loss since the last log event
  double lr = 0;
  double samples_per_s = 0; ///< since the last event of this kind
  /// Share of wall time the loop spent computing, not fetching data.
  double busy_fraction = 0;
  double eta_s = 0;
  /// The plan's, as it stands; text trained by a token budget (log events):
  /// the step's largest micro-batch in padded tokens, and its micro-batches.
  int64_t micro_batch_size = 0;
  int64_t accumulation_steps = 0;
  int64_t memory_used_bytes = 0;
  int64_t memory_peak_bytes = 0;
  int64_t memory_capacity_bytes = 0;
  /// Device utilization from the monitor hook; nullopt without one.
  std::optional<double> utilization;
  std::optional<double> test_accuracy;
  /// Gradient noise scale B_simple (log events); nullopt when not measured.
  std::optional<double> noise_scale;
  std::string message;
};

using TrainCallback = std::function<void(const TrainEvent&)>;
/// The hook a device monitor feeds: utilization in [0, 1], or nullopt
/// where it cannot be read.
using UtilizationSource = std::function<std::optional<double>()>;

/// The end of a run. JSON field names are stable (see `to_json`).
struct TrainSummary {
  int64_t steps = 0;     ///< optimizer steps (logical batches), resumed ones included
  int64_t samples = 0;   ///< training samples seen, resumed ones included
  double epochs = 0;     ///< steps / steps per epoch
  double final_loss = 0; ///< loss of the last logical batch
  std::optional<double> test_accuracy;  ///< nullopt without a test split
  int64_t oom_recoveries = 0;
  int64_t micro_batch_size = 0;    ///< at the end
  int64_t accumulation_steps = 0;  ///< at the end
  int64_t global_batch_size = 0;
  int64_t world_size = 1;
  int64_t skipped_steps = 0;       ///< fp16 steps skipped by the loss scaler
  std::optional<double> loss_scale;  ///< fp16: the loss scaler's scale at the end
  double seconds = 0;              ///< training time of this run, evaluation excluded
  double samples_per_s = 0;        ///< samples of this run / seconds
  /// Sequences: real (unpadded) tokens trained on, and per second; 0 where
  /// the input is no sequence (JSON `tokens_per_s` null).
  int64_t tokens = 0;
  double tokens_per_s = 0;
  /// Token-budget runs: padded tokens computed, and the budget at the end
  /// (smaller after an out-of-memory); 0 otherwise.
  int64_t padded_tokens = 0;
  int64_t token_budget = 0;
  /// Text runs (by a token budget or fixed batches): the real tokens an
  /// optimizer step gathers at least (`--target-tokens`, default one
  /// micro-batch's padded tokens), and the micro-batches run in all; 0
  /// otherwise.
  int64_t target_tokens = 0;
  int64_t micro_batches = 0;
  double data_wait_fraction = 0;   ///< share of `seconds` spent waiting for batches
  int64_t resumed_from_step = 0;   ///< 0 for a fresh run
  /// False when SIGINT or SIGTERM stopped the run early (see interrupt.h):
  /// the checkpoint, when on, holds the last step; no final evaluation.
  bool complete = true;
  std::string interrupted_by;      ///< "SIGINT" or "SIGTERM"; empty when complete
  std::optional<double> noise_scale;  ///< B_simple at the end; nullopt when not measured
  /// Why `noise_scale` is missing (see `read_noise_scale`): not measured,
  /// or unresolved; empty when it is a number.
  std::string noise_scale_note;
  /// True when `--resume` found the run already finished: nothing was
  /// trained, and this is the summary its last checkpoint saved.
  bool already_finished = false;
  /// The target that could end the run early; nullopt without one.
  std::optional<TrainTarget> target;
  /// True when the run stopped at `target` (then `complete` too).
  bool target_reached = false;
  /// True when `TrainOptions::time_limit_s` ended the run before its steps.
  bool time_limit_reached = false;
  /// Where the target was reached (nullopt without a target or when not
  /// reached): optimizer steps and samples, resumed ones included, and the
  /// training seconds of this run, evaluation excluded, as `seconds`.
  std::optional<int64_t> steps_to_target;
  std::optional<double> seconds_to_target;
  std::optional<int64_t> samples_to_target;
  /// `--adapt`: the global batch and lr over the run, one entry per change
  /// (the first the start); empty without `--adapt`. JSON `batch_schedule`.
  std::vector<BatchChange> batch_schedule;
  /// The loss not finite, or flat from the start (see `LossWatch`): the
  /// latest said; nullopt when the loss looked like training. JSON `divergence`.
  std::optional<Divergence> divergence;
};

/// File name of the checkpoint inside `--checkpoint DIR`.
constexpr const char* kCheckpointFile = "checkpoint.pt";

/// The training loop, one for images and text: trains `workload` with `plan`
/// on the batches of a `StepSource` — images: `train`'s samples, a logical
/// batch a step in micro-batches of the plan (the loss of each divided by its
/// share of the batch); text (`train_by_tokens`): micro-batches by a token
/// budget, grouped into steps by their real tokens — with the LR schedule per
/// optimizer step, autocast and the loss scaler per `plan.amp`. It evaluates
/// on `test` at each epoch's end (and every `eval_every` steps), stops at
/// `target_accuracy` when an evaluation reaches it or at `target_loss`,
/// recovers from out-of-memory by training the same step in smaller
/// micro-batches (the logical batch, LR and samples stay the same), follows
/// the noise scale with `adapt`, and writes checkpoints.
///
/// Example:
/// ```
///   batchtune::Trainer trainer(workload, *memory, plan, *data.train, data.test.get(),
///                              batchtune::TrainOptions().epochs(1).log_every(100));
///   trainer.set_callback([](const batchtune::TrainEvent& e) { ... });
///   batchtune::TrainSummary summary = trainer.run();
/// ```
class Trainer {
 public:
  /// Trains on the images (or other samples) of `train`.
  Trainer(Workload& workload, DeviceMemory& memory, Plan plan, const Dataset& train,
          const Dataset* test, TrainOptions options);
  /// Trains on the batches `make_source` makes of the trainer's plan as it
  /// stands (which the source may change: an out-of-memory, `--adapt`); `test`
  /// may be null. `train_by_tokens` makes a text run this way.
  Trainer(Workload& workload, DeviceMemory& memory, Plan plan, const Dataset* test,
          TrainOptions options,
          const std::function<std::unique_ptr<StepSource>(Plan&, DataParallel&)>& make_source);
  ~Trainer();

  void set_callback(TrainCallback callback) { callback_ = std::move(callback); }
  /// The monitor's hook for device utilization in log events.
  void set_utilization_source(UtilizationSource source) { utilization_ = std::move(source); }
  /// Called before each optimizer step with the steps done so far (tests
  /// use it to squeeze the memory budget mid-run).
  void set_before_step(std::function<void(int64_t)> hook) { before_step_ = std::move(hook); }
  /// As `TrainOptions::clock`, after construction (the noise run lends the
  /// tune's clock); it must outlive the run.
  void set_clock(const Clock& clock) { clock_ = &clock; }

  /// Trains data-parallel with the other ranks of `communicator` (which
  /// must outlive the run); the plan's world_size must be its world size.
  /// Under data parallelism the ranks measure the noise scale at every
  /// step, so no step is split or measured against the previous one.
  void set_communicator(Communicator* communicator) {
    data_parallel_ = DataParallel(communicator);
    training_step_.set_noise_from_ranks(data_parallel_.distributed());
  }
  const DataParallel& data_parallel() const { return data_parallel_; }

  /// Trains until the steps or epochs are done, or until an interrupt is
  /// requested (`interrupt_requested()`, polled after each optimizer step):
  /// then it writes the checkpoint and returns a summary marked incomplete.
  /// Throws `batchtune::Error`
  /// when even micro-batch 1 runs out of memory, or a checkpoint does not
  /// match this run.
  TrainSummary run();

  /// The plan as it stands (micro-batch and accumulation change on OOM).
  const Plan& plan() const { return plan_; }
  LossScaler& scaler() { return training_step_.scaler(); }
  /// `--adapt`: the changes so far, the first the start.
  const std::vector<BatchChange>& batch_schedule() const { return schedule_; }
  /// The gradient noise scale as measured so far; data parallelism adds the
  /// local against the all-reduced gradient to its `estimator()`.
  NoiseScaleTracker& noise_scale() { return training_step_.noise_scale(); }
  /// The training step it runs (the one the trial runner times).
  TrainingStep& training_step() { return training_step_; }

 private:
  /// Trains the step fetched from the source: its backward pass (retried in
  /// smaller micro-batches after an out-of-memory), the ranks' gradients
  /// averaged, the optimizer step.
  void train_step();
  /// True when the steps or epochs asked for are done.
  bool finished() const;
  /// Waits for queued device work and counts the wait as training time.
  void settle_clock();
  double evaluate();
  /// Evaluates the test split at this step, unless done already; true when
  /// the evaluation reached the target accuracy (recorded in `reached_`).
  bool evaluate_now(TrainEvent::Kind kind);
  /// `target_loss`: adds `loss`, the step's just trained, to the window;
  /// true when its mean reached the target (recorded in `reached_`).
  bool reached_target_loss(double loss);
  /// Writes the checkpoint (see checkpoint.h); `summary` when the run is finished.
  void save_checkpoint(const std::optional<TrainSummary>& summary = std::nullopt);
  /// Reads the checkpoint when there is one (sets `loaded_`); returns the
  /// summary it holds of a finished run.
  std::optional<TrainSummary> load_checkpoint();
  /// `--resume`: continues from the checkpoint when there is one; returns
  /// the summary of a run that was already finished (nothing to train).
  std::optional<TrainSummary> resume();
  /// The summary at the end of the run (`complete`: not interrupted).
  TrainSummary summary(bool complete, bool time_limit_reached);
  RunIdentity run_identity() const;
  void emit(TrainEvent::Kind kind, const std::string& message = "");
  /// The lr of optimizer step `step` before warm-up: the plan's, on its way
  /// from the last one over `kAdaptLrRampSteps` after an `--adapt` change.
  double lr_at(int64_t step) const;
  /// `--adapt`: times the window since the last decision and decides
  /// (rank 0, for all ranks); true when the batch changed.
  bool adapt_batch();
  /// Trains at `change` from now on (the plan, the step, the source).
  void apply_change(BatchChange change);
  /// `--adapt`'s state, as checkpoints keep it (adapt_checkpoint.h).
  AdaptCheckpoint adapt_checkpoint();
  /// Hands the losses summed since the last call to the watch (a wait for
  /// the device), and says a divergence it sees.
  void watch_loss();
  /// The optimizer steps the run takes in all, at the global batch as it
  /// stands; nullopt where only the end tells (text).
  std::optional<int64_t> planned_steps() const;

  Workload& workload_;
  DeviceMemory& memory_;
  Plan plan_;
  /// The plan as given: the run's identity (a resume must give the same).
  const Plan start_plan_;
  const Dataset* test_;
  TrainOptions options_;
  TrainingStep training_step_;
  TrainCallback callback_;
  UtilizationSource utilization_;
  std::function<void(int64_t)> before_step_;
  DataParallel data_parallel_;
  const Clock* clock_ = &steady_clock();
  /// What each step trains on (images or text).
  std::unique_ptr<StepSource> source_;

  // Position: optimizer steps done, the epoch under way.
  int64_t step_ = 0;
  int64_t epoch_ = 0;
  // --adapt: the policy, the changes, the lr ramp and the window timed.
  std::optional<BatchAdapter> adapter_;
  std::vector<BatchChange> schedule_;
  LrRamp ramp_;
  int64_t samples_ = 0;
  int64_t oom_recoveries_ = 0;
  std::optional<int64_t> total_steps_;
  int64_t resumed_from_step_ = 0;
  bool loaded_ = false;  // the run continues from a checkpoint
  double last_loss_ = 0;
  std::optional<double> test_accuracy_;
  int64_t test_accuracy_step_ = -1;
  struct Reached {
    int64_t step = 0;
    double train_seconds = 0;
    int64_t samples = 0;
  };
  std::optional<Reached> reached_;
  /// `target_loss`: the moving mean of the last steps' losses.
  std::optional<LossTarget> loss_target_;
  at::Tensor last_loss_tensor_;
  at::Tensor window_loss_;   // sum of logical-batch losses since the last log
  int64_t window_steps_ = 0;
  /// The loss not finite or flat: built as the run starts (a resume judges
  /// finiteness only); fed the steps' losses summed on the device.
  std::optional<LossWatch> loss_watch_;
  at::Tensor watch_loss_sum_;
  int64_t watch_steps_ = 0;
  // Timing of this run.
  double train_seconds_ = 0;
  double data_seconds_ = 0;
  int64_t run_samples_ = 0;
  struct Mark {
    double train_seconds = 0;
    double data_seconds = 0;
    int64_t samples = 0;
  };
  Mark log_mark_;
  Mark progress_mark_;
};

}  // namespace batchtune
