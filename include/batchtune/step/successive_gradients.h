#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "batchtune/step/noise_scale.h"

namespace batchtune {

/// The noise scale from what successive optimizer steps already computed,
/// for steps without accumulation or ranks to compare within the step (as
/// Pollux's implementation, adaptdl, measures a single process). The mean
/// gradients g1, g2, g3 of three successive steps over n1, n2, n3 samples
/// are independent draws, but between them the parameters moved: the
/// difference of two steps holds, beside the noise, the change of the true
/// gradient, which grows with the lr and counts as noise in proportion to
/// the batch (at a fixed 512 on lenet it read 4x the noise of one step's
/// halves). The second difference cancels a steady change:
///
///   E|g1 − 2·g2 + g3|² = tr(Σ)·(1/n1 + 4/n2 + 1/n3)
///   E(|g1|² + |g2|² + |g3|²)/3 = |G|² + tr(Σ)/n̄,  n̄ = 3 / (1/n1 + 1/n2 + 1/n3)
///
/// and a measurement hands the estimator those three squared norms at n̄ with
/// a big measurement at n1 + n2 + n3 that, with them, gives this trace.
/// Against splitting one step in 10 into halves
/// (`NoiseScaleTracker::small_batch`), it measures every step, with no extra
/// forward or backward. The price is two copies of the gradients (8 bytes a
/// parameter in fp32), kept between steps, and three norms a step.
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
  /// measurement against the two steps before, when both are kept of the
  /// same parameters, its norms unscaled; then this step's gradient is kept
  /// as the previous one.
  std::optional<NoiseMeasurement> measure(const std::vector<at::Tensor>& parameters, double size,
                                          const at::Tensor& loss_scale = {});
  /// Forgets the kept gradients and frees their memory: the next two steps
  /// only keep their own (a step that measured otherwise, or a changed model).
  void reset();
  /// Whether a previous step's gradient is kept.
  bool holding() const { return previous_.size > 0; }

  /// One kept step: its gradient (one tensor per parameter, undefined where
  /// it had none), its unscaled squared norm, its loss scale (undefined for
  /// none) and size (0: nothing kept).
  struct Kept {
    std::vector<at::Tensor> gradient;
    at::Tensor sq_norm;
    at::Tensor loss_scale;
    double size = 0;
  };
  /// What a checkpoint keeps, so that a resumed run measures its next steps
  /// as the run would have: the last step, the one before it, and the dot
  /// product of their gradients (unscaled; undefined without an earlier).
  struct State {
    Kept previous;
    Kept earlier;
    at::Tensor cross;
  };
  /// The kept tensors themselves, not copies: the next `measure` overwrites
  /// them in place (a checkpoint writes them out before).
  State state() const { return {previous_, earlier_, cross_}; }
  void load_state(State state);

 private:
  Kept previous_;
  Kept earlier_;
  at::Tensor cross_;  ///< earlier_'s gradient · previous_'s, unscaled
};

}  // namespace batchtune
