#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "batchtune/step/noise_scale.h"

namespace batchtune {

/// The noise scale from what successive optimizer steps already computed,
/// for steps without accumulation or ranks to compare within the step (how
/// Pollux's implementation, adaptdl, measures a single process). Step t's
/// mean gradient g_t over n_t samples and step t−1's over n_{t−1} are two
/// independent draws, so
///
///   small: (|g_{t−1}|² + |g_t|²) / 2  at  2 / (1/n_{t−1} + 1/n_t)
///   big:   |(n_{t−1}·g_{t−1} + n_t·g_t) / (n_{t−1} + n_t)|²  at  n_{t−1} + n_t
///
/// satisfy E = |G|² + tr(Σ)/B at their sizes, as the estimator needs. The
/// parameters moved by one step between the two, which adds a little to the
/// measured tr(Σ). Against splitting one step in 10 into halves
/// (`NoiseScaleTracker::small_batch`), it measures every step, at twice the
/// batch, with no extra forward or backward: on lenet it stays within
/// 0.56-2.3× of a 4,096-sample reference where the halves read 0.18-3.7×
/// (docs/benchmarks.md, "Which noise scale"). The price is one copy of the
/// gradients (4 bytes a parameter in fp32), kept between steps.
///
/// Example:
/// ```
///   batchtune::SuccessiveGradients successive;
///   // after each step's backward, before the optimizer step:
///   if (auto m = successive.measure(model->parameters(), batch_size)) tracker.add(*m);
/// ```
class SuccessiveGradients {
 public:
  /// After a step's backward over `size` samples (or tokens), its gradients
  /// those of a loss multiplied by `loss_scale` (a scalar tensor on their
  /// device, read without synchronising; undefined for none): the
  /// measurement against the previous step's gradient, when one is kept of
  /// the same parameters, its norms unscaled; then this step's gradient is
  /// kept in its place.
  std::optional<NoiseMeasurement> measure(const std::vector<at::Tensor>& parameters, double size,
                                          const at::Tensor& loss_scale = {});
  /// Forgets the kept gradient and frees its memory: the next step only
  /// keeps its own (a step that measured otherwise, or a changed model).
  void reset();
  /// Whether a previous step's gradient is kept.
  bool holding() const { return size_ > 0; }

  /// What a checkpoint keeps, so that a resumed run measures its first step
  /// as the run would have: the kept gradient (one tensor per parameter,
  /// undefined where it had none), its unscaled squared norm, its loss
  /// scale (undefined for none) and size (0: nothing kept).
  struct State {
    std::vector<at::Tensor> previous;
    at::Tensor sq_norm;
    at::Tensor loss_scale;
    double size = 0;
  };
  State state() const { return {previous_, previous_sq_norm_, previous_scale_, size_}; }
  void load_state(State state);

 private:
  std::vector<at::Tensor> previous_;  ///< one per parameter; undefined without a gradient
  at::Tensor previous_sq_norm_;  ///< unscaled
  at::Tensor previous_scale_;    ///< the loss scale of the kept gradient; undefined for none
  double size_ = 0;  ///< 0: nothing kept
};

}  // namespace batchtune
