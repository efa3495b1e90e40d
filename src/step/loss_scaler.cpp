#include "batchtune/step/loss_scaler.h"

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "batchtune/common/error.h"

namespace batchtune {
namespace {

std::vector<at::Tensor> gradients_of(torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> grads;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (p.grad().defined()) grads.push_back(p.mutable_grad());
    }
  }
  return grads;
}

}  // namespace

LossScaler::LossScaler(LossScalerOptions options, c10::Device device)
    : options_(options), device_(device) {
  if (!(options_.init_scale() > 0) || !(options_.growth_factor() > 1) ||
      !(options_.backoff_factor() > 0 && options_.backoff_factor() < 1) ||
      options_.growth_interval() < 1) {
    throw Error("loss scaler: need init scale > 0, growth factor > 1, backoff in (0, 1) and "
                "growth interval >= 1");
  }
  const auto on = at::TensorOptions().device(device_);
  scale_ = at::full({1}, options_.enabled() ? options_.init_scale() : 1.0, on.dtype(at::kFloat));
  growth_tracker_ = at::zeros({1}, on.dtype(at::kInt));
  found_inf_ = at::zeros({1}, on.dtype(at::kFloat));
}

at::Tensor LossScaler::scale(const at::Tensor& loss) const {
  if (!enabled()) return loss;
  return loss * scale_.to(loss.device()).reshape({});
}

bool LossScaler::unscale(const std::vector<at::Tensor>& gradients) {
  found_inf_.zero_();
  if (!enabled()) return true;
  at::NoGradGuard no_grad;
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  if (device_.is_cuda()) {
    at::_amp_foreach_non_finite_check_and_unscale_(gradients, found_inf_, inv_scale);
  } else {
    // The fused kernels are CUDA's; the same arithmetic with plain ops.
    bool finite = true;
    for (const auto& g : gradients) {
      g.mul_(inv_scale);
      if (finite && !at::isfinite(g).all().item<bool>()) finite = false;
    }
    if (!finite) found_inf_.fill_(1.0);
  }
  return found_inf_.item<float>() == 0.0F;
}

bool LossScaler::step(torch::optim::Optimizer& optimizer) {
  if (!enabled()) {
    optimizer.step();
    return true;
  }
  if (!unscale(gradients_of(optimizer))) {
    ++skipped_steps_;
    return false;
  }
  optimizer.step();
  return true;
}

void LossScaler::update() {
  if (!enabled()) return;
  if (device_.is_cuda()) {
    at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor(),
                           options_.backoff_factor(), options_.growth_interval());
    return;
  }
  double scale = scale_.item<double>();
  int64_t tracker = growth_tracker_.item<int64_t>();
  if (found_inf_.item<float>() != 0.0F) {
    scale *= options_.backoff_factor();
    tracker = 0;
  } else if (++tracker == options_.growth_interval()) {
    scale *= options_.growth_factor();
    tracker = 0;
  }
  scale_.fill_(scale);
  growth_tracker_.fill_(tracker);
}

double LossScaler::current_scale() const { return scale_.item<double>(); }
int64_t LossScaler::growth_tracker() const { return growth_tracker_.item<int64_t>(); }

std::vector<double> LossScaler::state() const {
  return {current_scale(), static_cast<double>(growth_tracker()),
          static_cast<double>(skipped_steps_)};
}

void LossScaler::load_state(const std::vector<double>& state) {
  TORCH_CHECK(state.size() == 3, "LossScaler::load_state: expected 3 values, got ",
              state.size());
  scale_.fill_(state[0]);
  growth_tracker_.fill_(static_cast<int64_t>(state[1]));
  skipped_steps_ = static_cast<int64_t>(state[2]);
}

}  // namespace batchtune
