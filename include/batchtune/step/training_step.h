#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/arg.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "batchtune/common/clock.h"
#include "batchtune/data/batch.h"
#include "batchtune/step/amp.h"
#include "batchtune/step/loss_scaler.h"
#include "batchtune/step/noise_scale.h"
#include "batchtune/step/successive_gradients.h"

namespace batchtune {

class Workload;

/// What a plan says of one optimizer step.
struct StepOptions {
  /// Samples per forward/backward; 0 for the whole logical batch at once.
  TORCH_ARG(int64_t, micro_batch_size) = 0;
  /// Autocast precision (never `kAuto`: resolve it with `choose_amp` first);
  /// `kFp16` also runs the dynamic loss scaler.
  TORCH_ARG(AmpMode, amp) = AmpMode::kOff;
  /// Measure the gradient noise scale on the steps `NoiseScaleTracker`
  /// picks (the first micro-batch against the logical batch; without
  /// accumulation, one step in `kNoiseScaleEveryWithoutAccumulation` split
  /// in two halves).
  TORCH_ARG(bool, measure_noise_scale) = false;
  /// Without accumulation, one step in this many is split to measure it.
  TORCH_ARG(int64_t, noise_scale_every) = kNoiseScaleEveryWithoutAccumulation;
  /// Without accumulation, measure every step against the two before it
  /// instead (`SuccessiveGradients`: no split, two copies of the gradients
  /// kept). Not under data parallelism, whose ranks measure each step.
  TORCH_ARG(bool, noise_from_successive_steps) = false;
  /// Data parallel: the ranks measure every step (this rank's gradient
  /// against the all-reduced one, added by the trainer), so no step is split
  /// in halves or measured against the previous one; a step that
  /// accumulates still measures its first micro-batch, which costs nothing.
  TORCH_ARG(bool, noise_from_ranks) = false;
};

/// The training step, once, for everything that runs one: the trial runner
/// times it, the training loop trains with it.
///
/// `backward()` makes one logical batch's gradients: the batch in
/// micro-batches, each moved to the device, its loss under autocast at the
/// plan's precision, weighted by its share of the batch and scaled by the
/// loss scaler, back-propagated. `apply()` is the optimizer step: unscaled
/// and skipped on inf/NaN for fp16, then the scale updated and the
/// gradients set to none. Between the two the caller may average gradients
/// across ranks. `run()` is both.
///
/// Example:
/// ```
///   batchtune::TrainingStep step(workload, device,
///                                batchtune::StepOptions().micro_batch_size(32)
///                                    .amp(batchtune::AmpMode::kBf16));
///   at::Tensor loss = step.run(batch);  // batch of 128: 4 micro-batches
/// ```
class TrainingStep {
 public:
  TrainingStep(Workload& workload, c10::Device device, StepOptions options = {});

  /// Gradients of `batch` (on the host or the device) from zero; returns its
  /// mean loss, detached, as a float scalar on the device (no
  /// synchronisation). `step_index` (optimizer steps before this one) picks
  /// the steps that measure the noise scale. Adds the time spent moving data
  /// (read on `clock()`) to `data_seconds` when given. An out-of-memory
  /// propagates, with the gradients dropped.
  at::Tensor backward(const Batch& batch, int64_t step_index = 0,
                      double* data_seconds = nullptr);
  /// The optimizer step on the gradients `backward` made, at `lr` for every
  /// parameter group when given. Returns false when the loss scaler skipped
  /// it (fp16 gradients that are not finite).
  bool apply(std::optional<double> lr = std::nullopt);
  /// Gradients of one optimizer step made of `micro_batches` (padded
  /// token batches of any sizes) from zero, each micro-batch's loss (its
  /// mean over real tokens) weighted by `weights` (their real tokens'
  /// share of the step's, so the loss is normalised per token). Returns the
  /// weighted loss, detached. An out-of-memory propagates, gradients dropped.
  ///
  /// With `noise_sizes` (each micro-batch's size in the units the noise
  /// scale is counted in, such as real tokens; at least two micro-batches,
  /// `weights` their shares), the first micro-batch's gradient is measured
  /// against the step's: one noise-scale measurement at (its size, their sum).
  /// A step of one micro-batch with its size measures against the previous
  /// step when `noise_from_successive_steps` says so.
  at::Tensor backward_weighted(const std::vector<Batch>& micro_batches,
                               const std::vector<double>& weights,
                               const std::vector<int64_t>& noise_sizes = {});
  /// `backward` then `apply`: what a trial times.
  at::Tensor run(const Batch& batch, int64_t step_index = 0);

  const StepOptions& options() const { return options_; }
  int64_t micro_batch_size() const { return options_.micro_batch_size(); }
  /// Whether the ranks measure each step (`StepOptions::noise_from_ranks`).
  void set_noise_from_ranks(bool on);
  /// After an out-of-memory: the next steps run smaller micro-batches.
  void set_micro_batch_size(int64_t micro_batch_size);
  LossScaler& scaler() { return scaler_; }
  NoiseScaleTracker& noise_scale() { return noise_; }
  /// The gradient kept to measure the next step against (for a checkpoint).
  SuccessiveGradients& successive() { return successive_; }
  Workload& workload() { return workload_; }
  /// The clock the time spent moving data is read on (a fake in tests); it
  /// must outlive the step.
  void set_clock(const Clock& clock) { clock_ = &clock; }
  const Clock& clock() const { return *clock_; }

 private:
  at::Tensor accumulate(const Batch& batch, double* data_seconds);
  /// The gradients just made, over `size`, against the two steps' before.
  void measure_successive(double size);
  at::Tensor accumulate_measuring_noise(const Batch& batch, int64_t small_batch,
                                        double* data_seconds);

  Workload& workload_;
  c10::Device device_;
  StepOptions options_;
  LossScaler scaler_;
  NoiseScaleTracker noise_;
  SuccessiveGradients successive_;
  const Clock* clock_ = &steady_clock();
};

/// Sets the learning rate of every parameter group.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace batchtune
