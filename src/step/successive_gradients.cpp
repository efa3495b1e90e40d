#include "batchtune/step/successive_gradients.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "batchtune/step/noise_scale.h"

namespace batchtune {
namespace {

/// Whether `previous` holds a gradient for exactly the parameters that have
/// one now.
bool same_layout(const std::vector<at::Tensor>& previous,
                 const std::vector<at::Tensor>& parameters) {
  if (previous.size() != parameters.size()) return false;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const at::Tensor& grad = parameters[i].grad();
    if (grad.defined() != previous[i].defined()) return false;
    if (grad.defined() && (!grad.sizes().equals(previous[i].sizes()) ||
                           grad.scalar_type() != previous[i].scalar_type())) {
      return false;
    }
  }
  return true;
}

/// Σ g·p over the parameters' gradients and `previous`, a float scalar on
/// their device; at::dot on flat views allocates nothing the size of a
/// gradient.
at::Tensor dot(const std::vector<at::Tensor>& parameters, const std::vector<at::Tensor>& previous) {
  std::vector<at::Tensor> dots;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const at::Tensor& grad = parameters[i].grad();
    if (!grad.defined()) continue;
    dots.push_back(at::dot(grad.reshape(-1), previous[i].reshape(-1)).to(at::kFloat));
  }
  if (dots.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kFloat));
  return at::stack(dots).sum();
}

/// Copies the parameters' gradients into `kept` (reusing its tensors when
/// they have the same layout) with their unscaled squared norm, loss scale and
/// size.
void keep(SuccessiveGradients::Kept& kept, const std::vector<at::Tensor>& parameters,
          at::Tensor sq_norm, at::Tensor scale, double size) {
  if (kept.size > 0 && same_layout(kept.gradient, parameters)) {
    std::vector<at::Tensor> grads;
    std::vector<at::Tensor> into;
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (!parameters[i].grad().defined()) continue;
      grads.push_back(parameters[i].grad());
      into.push_back(kept.gradient[i]);
    }
    if (!grads.empty()) at::_foreach_copy_(into, grads);
  } else {
    kept.gradient.clear();
    kept.gradient.reserve(parameters.size());
    for (const auto& p : parameters) {
      kept.gradient.push_back(p.grad().defined() ? p.grad().detach().clone() : at::Tensor());
    }
  }
  kept.sq_norm = std::move(sq_norm);
  kept.loss_scale = std::move(scale);
  kept.size = size;
}

/// Σ g·k over the parameters' gradients and a kept gradient, unscaled by
/// the current `scale` and the kept one's.
at::Tensor unscaled_dot(const std::vector<at::Tensor>& parameters, const at::Tensor& scale,
                        const SuccessiveGradients::Kept& kept) {
  at::Tensor d = dot(parameters, kept.gradient);
  if (scale.defined()) d = d / scale;
  if (kept.loss_scale.defined()) d = d / kept.loss_scale;
  return d;
}

}  // namespace

std::optional<NoiseMeasurement> SuccessiveGradients::measure(
    const std::vector<at::Tensor>& parameters, double size, const at::Tensor& loss_scale) {
  TORCH_CHECK(size > 0, "SuccessiveGradients::measure: the step's size must be positive, got ",
              size);
  // Everything unscaled on the device: a scaler that moved between the
  // steps costs no synchronisation and no lost measurement.
  const at::Tensor scale =
      loss_scale.defined() ? loss_scale.detach().reshape({}).to(at::kFloat).clone() : at::Tensor();
  at::Tensor sq_norm = squared_gradient_norm(parameters);
  if (scale.defined()) sq_norm = sq_norm / (scale * scale);
  const bool after_previous = previous_.size > 0 && same_layout(previous_.gradient, parameters);
  const bool after_two =
      after_previous && earlier_.size > 0 && same_layout(earlier_.gradient, parameters);
  std::optional<NoiseMeasurement> measurement;
  at::Tensor cross;  // this step's gradient · the previous one's
  if (after_previous) cross = unscaled_dot(parameters, scale, previous_);
  if (after_two) {
    // |g1 − 2·g2 + g3|², each term from the norms and dots on the device.
    const double n1 = earlier_.size;
    const double n2 = previous_.size;
    const double n3 = size;
    const at::Tensor second_difference =
        earlier_.sq_norm + previous_.sq_norm * 4 + sq_norm - cross_ * 4 - cross * 4 +
        unscaled_dot(parameters, scale, earlier_) * 2;
    const at::Tensor trace = second_difference / (1 / n1 + 4 / n2 + 1 / n3);
    // The three steps' squared norms at their harmonic mean size, and the
    // big measurement that, with it, gives the estimator this trace.
    const double small_batch = 3 / (1 / n1 + 1 / n2 + 1 / n3);
    const double big_batch = n1 + n2 + n3;
    at::Tensor small = (earlier_.sq_norm + previous_.sq_norm + sq_norm) / 3;
    at::Tensor big = small - trace * (1 / small_batch - 1 / big_batch);
    measurement = NoiseMeasurement{small_batch, std::move(small), big_batch, std::move(big)};
  }
  // Keep this step's gradient, the previous one's as the earlier.
  if (after_previous) {
    std::swap(earlier_, previous_);
    cross_ = std::move(cross);
  } else {
    reset();
  }
  keep(previous_, parameters, std::move(sq_norm), scale, size);
  return measurement;
}

void SuccessiveGradients::load_state(State state) {
  for (const Kept* kept : {&state.previous, &state.earlier}) {
    TORCH_CHECK(kept->size == 0 || kept->sq_norm.defined(),
                "SuccessiveGradients::load_state: a kept gradient needs its squared norm");
  }
  TORCH_CHECK(state.earlier.size == 0 || (state.previous.size > 0 && state.cross.defined()),
              "SuccessiveGradients::load_state: an earlier gradient needs a previous one and "
              "their dot product");
  previous_ = std::move(state.previous);
  earlier_ = std::move(state.earlier);
  cross_ = std::move(state.cross);
  if (previous_.size == 0) reset();
  if (earlier_.size == 0) {
    earlier_ = Kept();
    cross_ = at::Tensor();
  }
}

void SuccessiveGradients::reset() {
  previous_ = Kept();
  earlier_ = Kept();
  cross_ = at::Tensor();
}

}  // namespace batchtune
