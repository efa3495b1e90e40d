#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "batchtune/common/clock.h"
#include "batchtune/common/estimate.h"
#include "batchtune/step/amp.h"
#include "batchtune/step/training_step.h"

namespace batchtune {

class DeviceMemory;
class Lockstep;
class TrainingSnapshot;
class Workload;
struct Batch;

/// Gives the trial its input, one batch per step (a data loader). The time
/// it takes is the step's data wait.
using BatchSource = std::function<Batch(int64_t batch_size)>;

/// Headroom kept off the device's capacity before anything is compared:
/// 10 %, for allocator fragmentation and for memory that grows after the
/// probe (longer batches, checkpoints, a second optimizer state).
constexpr double kDefaultMargin = 0.10;
/// The margin at most: a tenth of the memory left usable. Past it the
/// usable memory is too small to say anything about the device (0.999999999
/// left a few bytes, and the model itself then ran out of memory).
constexpr double kMaxMargin = 0.9;

/// Checks a margin given by the user: from 0 to `kMaxMargin`. Throws
/// `batchtune::Error` naming --margin.
void check_margin(double margin);

/// Timed steps of a calibrated trial at most (`TrialOptions::max_steps`):
/// google/benchmark caps its iterations too; a sub-microsecond step would
/// otherwise need millions to fill a second.
constexpr int64_t kMaxTrialSteps = 2000;
/// Warm-up goes on while a step is more than 10 % faster than the one before
/// (kernels still being compiled, oneDNN primitives built, cuDNN autotuning):
/// timing then starts once the step time has settled.
constexpr double kSettledRatio = 0.9;
/// Settling warm-up steps may take this share of a trial's slice at most,
/// so that the timed steps keep the rest.
constexpr double kWarmupSliceShare = 0.5;
/// fp16: warm-up goes on, past `max_warmup_steps`, while the loss scaler
/// skips the optimizer step for inf/NaN gradients (a skipped step allocates
/// no optimizer state and times no update), at most this many extra steps:
/// the scale starts at 2^16 and halves at each skip, so 24 reach 2^-8, past
/// which gradients that still overflow fp16 are the model's, not the scale's.
constexpr int64_t kMaxSkippedWarmupSteps = 24;

/// How one trial runs. By default a fixed count of steps; given `min_time_s`
/// it is calibrated as benchmark tools do: warm-up until the step time
/// settles (up to `max_warmup_steps`), then timed steps until they add up to
/// `min_time_s`, never past the trial's slice `max_time_s`.
struct TrialOptions {
  TORCH_ARG(int64_t, batch_size) = 1;
  /// Timed steps at least (when the slice allows more than one).
  TORCH_ARG(int64_t, steps) = 3;
  /// Untimed steps before them, at least: the first step allocates the
  /// optimizer state and the allocators' caches, and LibTorch picks its
  /// kernels.
  TORCH_ARG(int64_t, warmup_steps) = 1;
  /// More warm-up steps, up to this many in all, while the step time is
  /// still falling (see `kSettledRatio`); 0 for exactly `warmup_steps`.
  TORCH_ARG(int64_t, max_warmup_steps) = 0;
  /// Timed steps go on until they add up to this many seconds (0: exactly
  /// `steps`), up to `max_steps` (or `steps`, when that is more).
  TORCH_ARG(double, min_time_s) = 0;
  TORCH_ARG(int64_t, max_steps) = kMaxTrialSteps;
  /// The trial's slice of the time budget, from its start: no step starts
  /// that the one before says would end past it. The minimum warm-up and
  /// one timed step always run (the memory is measured whatever the time).
  TORCH_ARG(double, max_time_s) = std::numeric_limits<double>::infinity();
  /// Where each step's batch comes from; by default the subject's own batch
  /// (for a workload: one synthetic batch made before the first step and
  /// reused, so no data wait).
  TORCH_ARG(BatchSource, batch_source) = nullptr;
  /// Sequences: tokens per sample of the trial's batches (see `at_length`);
  /// 0 for the longest the input spec allows, the worst case.
  TORCH_ARG(int64_t, sequence_length) = 0;
  /// A trial of a largest-batch search: on CUDA its tensors must also leave
  /// `kCudaFragmentationReserve` of the allocator's cap unused, else it is
  /// over budget, so that the batch a search finds runs in the next process
  /// too. A probe, or training, asks only whether the batch runs.
  TORCH_ARG(bool, keep_fragmentation_reserve) = false;
};

/// What a trial trains: the seam between the trial runner, which times and
/// measures, and whoever owns the model, the optimizer and the step (a
/// `Workload` through `WorkloadTrial`; the Python package's `nn.Module`,
/// optimizer and loss function).
///
/// The runner calls `save()`, then `prepare(batch_size)`, then
/// `next_batch()` and `step()` once per step, then `restore()` whatever
/// happened. `restore()` must leave everything a step changes (parameters,
/// buffers, gradients, optimizer state, random generators) as `save()` found
/// it, and drop the prepared batch.
class TrialSubject {
 public:
  virtual ~TrialSubject() = default;
  /// The model, for messages.
  virtual std::string describe() const = 0;
  /// The precision the step runs at.
  virtual AmpMode amp() const { return AmpMode::kOff; }
  /// Keeps what a step changes, so that `restore()` can put it back.
  virtual void save() = 0;
  /// Untimed, before the first step: makes what steps at `batch_size` need.
  virtual void prepare(int64_t batch_size) = 0;
  /// Sequences: the length the next `prepare` makes its batches at; 0 for
  /// the longest. A subject without sequence lengths takes only 0 (and
  /// throws `batchtune::Error` for anything else).
  virtual void set_sequence_length(int64_t length);
  /// Tokens per sample of the prepared batches; 0 where the input is no
  /// sequence (then no `tokens_per_s` is reported).
  virtual int64_t sequence_length() const { return 0; }
  /// Timed as the step's data wait: takes the next step's batch from
  /// `source` when given, else reuses the prepared one.
  virtual void next_batch(const BatchSource& source) { (void)source; }
  /// One training step exactly as training runs it; returns the loss (a
  /// scalar tensor; it need not be synchronised).
  virtual at::Tensor step() = 0;
  virtual void restore() = 0;
  /// fp16: whether the last `step()` skipped the optimizer step (the loss
  /// scaler found inf/NaN gradients). The runner warms up until a step is
  /// taken (see `kMaxSkippedWarmupSteps`).
  virtual bool last_step_skipped() const { return false; }
  /// Evaluation: while on, `step()` runs forward and loss only, as an
  /// evaluation loop does (no gradients kept, no backward, no optimizer
  /// step, the model in eval mode). Returns false where the subject has no
  /// forward-only step (then no evaluation batch is searched).
  virtual bool set_forward_only(bool on) { return !on; }
  /// Whether a step meets the other ranks (a data-parallel model that
  /// averages its gradients, a sharded one that gathers its parameters):
  /// then several ranks run their trials in lockstep (see `Lockstep`).
  virtual bool communicates() const { return false; }
  /// The trials' lockstep, before the first trial of a subject that
  /// communicates (nullptr: none); the step calls `check_peers()` before
  /// its collectives.
  virtual void set_lockstep(Lockstep* lockstep) { (void)lockstep; }
};

/// Forward-only steps on `subject` while in scope (see
/// `TrialSubject::set_forward_only`); `supported()` says whether it took.
class ForwardOnlyScope {
 public:
  explicit ForwardOnlyScope(TrialSubject& subject)
      : subject_(subject), supported_(subject.set_forward_only(true)) {}
  ~ForwardOnlyScope() {
    if (supported_) subject_.set_forward_only(false);
  }
  ForwardOnlyScope(const ForwardOnlyScope&) = delete;
  ForwardOnlyScope& operator=(const ForwardOnlyScope&) = delete;
  bool supported() const { return supported_; }

 private:
  TrialSubject& subject_;
  bool supported_;
};

/// A `Workload` as a trial subject: its `TrainingStep` at the whole batch
/// (the trial's batch size is the micro-batch) and precision `amp`, on
/// synthetic batches unless a batch source is given.
class WorkloadTrial : public TrialSubject {
 public:
  WorkloadTrial(Workload& workload, c10::Device device, AmpMode amp = AmpMode::kOff);
  ~WorkloadTrial() override;

  std::string describe() const override;
  AmpMode amp() const override { return amp_; }
  void save() override;
  void prepare(int64_t batch_size) override;
  void set_sequence_length(int64_t length) override;
  int64_t sequence_length() const override;
  void next_batch(const BatchSource& source) override;
  at::Tensor step() override;
  void restore() override;
  bool last_step_skipped() const override { return last_skipped_; }
  bool set_forward_only(bool on) override;
  Workload& workload() { return workload_; }
  /// fp16: the loss scale the next trial starts from (the last trial's
  /// final scale; empty before the first). Each trial makes a new step, and
  /// a new scaler at 2^16 would overflow and skip the first steps again.
  std::optional<double> loss_scale() const { return loss_scale_; }

 private:
  Workload& workload_;
  c10::Device device_;
  AmpMode amp_;
  int64_t batch_size_ = 0;
  int64_t length_ = 0;  // 0: the spec's longest
  bool forward_only_ = false;
  std::unique_ptr<Batch> batch_;
  std::unique_ptr<TrainingStep> step_;
  std::unique_ptr<TrainingSnapshot> snapshot_;
  std::optional<double> loss_scale_;
  bool last_skipped_ = false;
};

/// Why a trial did not fit.
enum class TrialFailure {
  kNone,
  kOutOfMemory,  ///< an allocation failed
  kOverBudget,   ///< it ran, but its peak passed the usable budget
  /// LibTorch refused the size itself: batch norm at batch 1, a CUDA launch
  /// configuration too large, cuDNN "not supported". It bounds the search
  /// like an out-of-memory.
  kDoesNotRun,
};


/// What one trial measured. Plain data: everything above the trial runner
/// works with these, never with exceptions.
struct TrialResult {
  int64_t batch_size = 0;
  /// Precision the step ran at (`off`, `bf16`, `fp16`).
  AmpMode amp = AmpMode::kOff;
  bool fits = false;
  TrialFailure failure = TrialFailure::kNone;
  /// Peak device memory during the trial (see `DeviceMemory::peak_bytes`).
  int64_t peak_bytes = 0;
  int64_t capacity_bytes = 0;
  /// capacity × (1 − margin): what "fits" is compared with.
  int64_t usable_bytes = 0;
  double margin = kDefaultMargin;
  /// Training steps run, warm-up included.
  int64_t steps_run = 0;
  /// Of which untimed warm-up.
  int64_t warmup_steps_run = 0;
  /// Seconds of each timed step: waiting for its batch, then computing.
  std::vector<double> step_seconds;
  /// Of which waiting for the input batch.
  std::vector<double> wait_seconds;
  /// Compute time over step time, over the timed steps (1 = never waiting).
  double busy = 0;
  /// When the timed steps began and ended, on the runner's clock (both 0
  /// when none ran): the window a monitor's readings for the trial cover,
  /// without the snapshot, the batch building, the warm-up and the restore.
  double timed_from_s = 0;
  double timed_to_s = 0;
  /// Mean device utilization % over the timed steps, where a monitor
  /// measured it.
  std::optional<double> utilization;
  /// Device energy during the timed steps, where a counter exists.
  std::optional<double> energy_joules;
  double step_ms = 0;         ///< median step time
  double step_ms_spread = 0;  ///< interquartile range / median (0 = steady)
  double samples_per_s = 0;   ///< batch size / median step time
  /// The median step time (ms) with its confidence interval (see
  /// `Estimate`), and the same as samples/s.
  Estimate step_ms_ci;
  Estimate samples_per_s_ci;
  /// The interval is too wide to decide on (see `Estimate::noisy`), and
  /// what the machine was doing meanwhile that likely made it so ("other
  /// processes used 1.0 of 2 cores"; empty when nothing was seen).
  bool noisy = false;
  std::string noise_cause;
  /// Sequences: tokens per sample the trial ran at (0: no sequence input).
  int64_t sequence_length = 0;
  /// samples/s × sequence length (0 without a sequence).
  double tokens_per_s = 0;
  double loss = 0;            ///< loss of the last step
  /// Empty when it fits.
  std::string error;
};

/// The one primitive everything else calls: runs the real training step at
/// a batch size and measures it, leaving no trace.
///
/// After `run()` the model's parameters, buffers, gradients and optimizer
/// state, and LibTorch's CPU random generator, are bit-identical to before,
/// and live device memory is back where it was, whether the trial fitted or
/// not. The snapshot that makes this possible is kept off the measured
/// device (host memory, outside the CPU budget's count).
///
/// Example:
/// ```
///   auto memory = batchtune::make_device_memory(c10::kCPU, 512 << 20);
///   batchtune::TrialRunner runner(workload, *memory, batchtune::kDefaultMargin);
///   auto result = runner.run(batchtune::TrialOptions().batch_size(64));
///   if (!result.fits) std::cout << result.error;
/// ```
class TrialRunner {
 public:
  /// Trials of `subject` (which must outlive the runner).
  TrialRunner(TrialSubject& subject, DeviceMemory& memory, double margin = kDefaultMargin);
  /// Trials of `workload`'s training step at precision `amp`.
  TrialRunner(Workload& workload, DeviceMemory& memory, double margin = kDefaultMargin,
              AmpMode amp = AmpMode::kOff);
  ~TrialRunner();

  /// Runs one trial. Only out-of-memory becomes a result with
  /// `fits == false`; other errors (a shape mismatch) propagate.
  TrialResult run(const TrialOptions& options);

  /// The clock steps are timed on (the steady clock unless set; a fake in
  /// tests, which the subject's steps then advance). Must outlive the runner.
  void set_clock(const Clock& clock) { clock_ = &clock; }
  const Clock& clock() const { return *clock_; }
  /// Several ranks whose steps communicate: every trial in lockstep with
  /// the others (nullptr: alone). Must outlive the runner's trials.
  void set_lockstep(Lockstep* lockstep);

  /// Training steps run by all trials so far.
  int64_t total_steps() const { return total_steps_; }
  double margin() const { return margin_; }
  DeviceMemory& memory() { return memory_; }
  TrialSubject& subject() { return *subject_; }
  AmpMode amp() const { return subject_->amp(); }

 private:
  TrialRunner(std::unique_ptr<TrialSubject> owned, DeviceMemory& memory, double margin);

  std::unique_ptr<TrialSubject> owned_;  // the workload's, when made from one
  TrialSubject* subject_;
  DeviceMemory& memory_;
  double margin_;
  const Clock* clock_ = &steady_clock();
  Lockstep* lockstep_ = nullptr;
  int64_t total_steps_ = 0;
};

/// Fills `step_ms`, `step_ms_spread`, `samples_per_s`, `tokens_per_s`,
/// `busy` and the intervals from `step_seconds` and `wait_seconds` (a
/// sweep's re-measurement calls it again after adding steps).
void summarize_steps(TrialResult& result);

}  // namespace batchtune
