#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace batchtune {

/// Starting loss scale: 2^16, as PyTorch's GradScaler; large enough that
/// small fp16 gradients do not flush to zero, and backed off within a few
/// steps when it overflows.
constexpr double kDefaultInitScale = 65536.0;
/// Scale multiplier after `kDefaultGrowthInterval` finite steps in a row.
constexpr double kDefaultGrowthFactor = 2.0;
/// Scale multiplier after a step with non-finite gradients.
constexpr double kDefaultBackoffFactor = 0.5;
/// Finite steps in a row before the scale grows: long enough that a scale
/// that just overflowed is not raised straight back.
constexpr int64_t kDefaultGrowthInterval = 2000;

struct LossScalerOptions {
  /// Off makes the scaler a pass-through (scale 1, every step taken): what
  /// fp32 and bf16 training use.
  TORCH_ARG(bool, enabled) = true;
  TORCH_ARG(double, init_scale) = kDefaultInitScale;
  TORCH_ARG(double, growth_factor) = kDefaultGrowthFactor;
  TORCH_ARG(double, backoff_factor) = kDefaultBackoffFactor;
  TORCH_ARG(int64_t, growth_interval) = kDefaultGrowthInterval;
};

/// The dynamic loss scaler of fp16 training (LibTorch's C++ API has no
/// GradScaler): the loss is multiplied by the scale before backward; before
/// the optimizer step the gradients are divided by it and checked; a step
/// with an infinity or NaN is skipped and the scale backed off, and after
/// `growth_interval` good steps in a row it grows. On CUDA it uses the fused
/// `_amp_foreach_non_finite_check_and_unscale_` and `_amp_update_scale_`
/// kernels; elsewhere the same arithmetic with plain tensor ops.
///
/// Example:
/// ```
///   batchtune::LossScaler scaler(batchtune::LossScalerOptions(), device);
///   scaler.scale(loss).backward();
///   bool stepped = scaler.step(optimizer);  // skipped on inf/NaN
///   scaler.update();
/// ```
class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {},
                      c10::Device device = c10::Device(c10::kCPU));

  bool enabled() const { return options_.enabled(); }
  /// `loss × scale` (the loss itself when disabled).
  at::Tensor scale(const at::Tensor& loss) const;
  /// Divides the gradients of `optimizer`'s parameters by the scale and
  /// checks them; then takes the optimizer step unless one was not finite.
  /// Returns whether the step was taken.
  bool step(torch::optim::Optimizer& optimizer);
  /// Same on a list of gradients (no optimizer): unscales in place and
  /// returns true when all are finite.
  bool unscale(const std::vector<at::Tensor>& gradients);
  /// Grows or backs off the scale from what the last `step`/`unscale` found.
  void update();

  double current_scale() const;
  /// The scale as a float [1] tensor on the device (no synchronisation);
  /// updated in place by `update()`.
  const at::Tensor& scale_tensor() const { return scale_; }
  int64_t growth_tracker() const;
  /// Steps skipped for non-finite gradients.
  int64_t skipped_steps() const { return skipped_steps_; }

  /// For checkpoints: the scale, the growth tracker and skipped steps.
  std::vector<double> state() const;
  void load_state(const std::vector<double>& state);

 private:
  LossScalerOptions options_;
  c10::Device device_;
  at::Tensor scale_;           // float [1] on the device
  at::Tensor growth_tracker_;  // int32 [1] on the device
  at::Tensor found_inf_;       // float [1]: 1 when the last unscale saw inf/NaN
  int64_t skipped_steps_ = 0;
};

}  // namespace batchtune
