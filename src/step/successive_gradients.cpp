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

}  // namespace

std::optional<NoiseMeasurement> SuccessiveGradients::measure(
    const std::vector<at::Tensor>& parameters, double size, const at::Tensor& loss_scale) {
  TORCH_CHECK(size > 0, "SuccessiveGradients::measure: the step's size must be positive, got ",
              size);
  // Everything unscaled on the device: a scaler that moved between the two
  // steps costs no synchronisation and no lost measurement.
  const at::Tensor scale =
      loss_scale.defined() ? loss_scale.detach().reshape({}).to(at::kFloat).clone() : at::Tensor();
  at::Tensor sq_norm = squared_gradient_norm(parameters);
  if (scale.defined()) sq_norm = sq_norm / (scale * scale);
  std::optional<NoiseMeasurement> measurement;
  const bool comparable = holding() && same_layout(previous_, parameters);
  if (comparable) {
    const double total = size_ + size;
    const double w_previous = size_ / total;
    const double w_current = size / total;
    at::Tensor cross = dot(parameters, previous_);
    if (scale.defined()) cross = cross / scale;
    if (previous_scale_.defined()) cross = cross / previous_scale_;
    at::Tensor big = previous_sq_norm_ * (w_previous * w_previous) +
                     sq_norm * (w_current * w_current) + cross * (2 * w_previous * w_current);
    measurement = NoiseMeasurement{2 / (1 / size_ + 1 / size), (previous_sq_norm_ + sq_norm) / 2,
                                   total, std::move(big)};
  }
  // Keep this step's gradient: copied into the kept tensors when they fit.
  if (comparable) {
    std::vector<at::Tensor> grads;
    std::vector<at::Tensor> kept;
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (!parameters[i].grad().defined()) continue;
      grads.push_back(parameters[i].grad());
      kept.push_back(previous_[i]);
    }
    if (!grads.empty()) at::_foreach_copy_(kept, grads);
  } else {
    reset();
    previous_.reserve(parameters.size());
    for (const auto& p : parameters) {
      previous_.push_back(p.grad().defined() ? p.grad().detach().clone() : at::Tensor());
    }
  }
  previous_sq_norm_ = std::move(sq_norm);
  previous_scale_ = scale;
  size_ = size;
  return measurement;
}

void SuccessiveGradients::load_state(State state) {
  TORCH_CHECK(state.size == 0 || state.sq_norm.defined(),
              "SuccessiveGradients::load_state: a kept gradient needs its squared norm");
  previous_ = std::move(state.previous);
  previous_sq_norm_ = std::move(state.sq_norm);
  previous_scale_ = std::move(state.loss_scale);
  size_ = state.size;
  if (size_ == 0) reset();
}

void SuccessiveGradients::reset() {
  previous_.clear();
  previous_sq_norm_ = at::Tensor();
  previous_scale_ = at::Tensor();
  size_ = 0;
}

}  // namespace batchtune
