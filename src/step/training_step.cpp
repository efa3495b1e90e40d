#include "batchtune/step/training_step.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/optim/optimizer.h>

#include <algorithm>

#include "batchtune/common/error.h"
#include "batchtune/step/workload.h"

namespace batchtune {
namespace {

std::vector<at::Tensor> defined_gradients(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

}  // namespace

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

TrainingStep::TrainingStep(Workload& workload, c10::Device device, StepOptions options)
    : workload_(workload),
      device_(device),
      options_(options),
      scaler_(LossScalerOptions().enabled(options.amp() == AmpMode::kFp16), device) {
  TORCH_CHECK(options_.amp() != AmpMode::kAuto,
              "TrainingStep: resolve amp auto (choose_amp) before stepping");
  TORCH_CHECK(options_.micro_batch_size() >= 0, "TrainingStep: negative micro-batch");
}

void TrainingStep::set_micro_batch_size(int64_t micro_batch_size) {
  TORCH_CHECK(micro_batch_size >= 1, "TrainingStep: micro-batch must be at least 1");
  options_.micro_batch_size(micro_batch_size);
}

void TrainingStep::set_noise_from_ranks(bool on) {
  options_.noise_from_ranks(on);
  if (on) successive_.reset();  // no step is measured against the previous one
}

at::Tensor TrainingStep::backward(const Batch& batch, int64_t step_index, double* data_seconds) {
  workload_.optimizer().zero_grad(/*set_to_none=*/true);
  try {
    const int64_t micro = options_.micro_batch_size() > 0 ? options_.micro_batch_size()
                                                          : batch.size();
    if (options_.measure_noise_scale() && options_.noise_from_successive_steps() &&
        !options_.noise_from_ranks() && micro >= batch.size()) {
      at::Tensor loss = accumulate(batch, data_seconds);
      measure_successive(static_cast<double>(batch.size()));
      return loss;
    }
    successive_.reset();
    const int64_t small =
        options_.measure_noise_scale() && (!options_.noise_from_ranks() || micro < batch.size())
            ? NoiseScaleTracker::small_batch(step_index, batch.size(), micro,
                                           options_.noise_scale_every())
            : 0;
    return small > 0 ? accumulate_measuring_noise(batch, small, data_seconds)
                     : accumulate(batch, data_seconds);
  } catch (...) {
    // A failed step leaves partial gradients behind: none survive it.
    workload_.optimizer().zero_grad(/*set_to_none=*/true);
    throw;
  }
}

bool TrainingStep::apply(std::optional<double> lr) {
  auto& optimizer = workload_.optimizer();
  if (lr) set_learning_rate(optimizer, *lr);
  const bool stepped = scaler_.step(optimizer);
  scaler_.update();
  optimizer.zero_grad(/*set_to_none=*/true);
  return stepped;
}

at::Tensor TrainingStep::backward_weighted(const std::vector<Batch>& micro_batches,
                                           const std::vector<double>& weights,
                                           const std::vector<int64_t>& noise_sizes) {
  TORCH_CHECK(!micro_batches.empty() && micro_batches.size() == weights.size(),
              "TrainingStep: one weight per micro-batch");
  const bool successive = options_.noise_from_successive_steps() && micro_batches.size() == 1 &&
                          noise_sizes.size() == 1;
  const bool measure = !noise_sizes.empty() && !successive;
  TORCH_CHECK(successive || !measure ||
                  (noise_sizes.size() == micro_batches.size() && micro_batches.size() >= 2),
              "TrainingStep: a noise measurement needs two micro-batches and one size each "
              "(or one, against the previous step)");
  if (!successive) successive_.reset();
  workload_.optimizer().zero_grad(/*set_to_none=*/true);
  try {
    const std::vector<at::Tensor> parameters =
        measure ? workload_.model().parameters() : std::vector<at::Tensor>{};
    at::Tensor small_sq;
    at::Tensor loss_sum;
    for (size_t i = 0; i < micro_batches.size(); ++i) {
      const Batch batch = to_device(micro_batches[i], device_);
      at::Tensor loss;
      {
        AutocastGuard autocast(device_.type(), options_.amp());
        loss = workload_.compute_loss(batch);
      }
      // Measuring: the first micro-batch's gradient alone, its norm taken,
      // then weighted by its share like the others.
      const bool first_alone = measure && i == 0;
      scaler_.scale(first_alone ? loss : loss * weights[i]).backward();
      if (first_alone) {
        small_sq = squared_gradient_norm(parameters);
        std::vector<at::Tensor> grads = defined_gradients(parameters);
        if (!grads.empty()) at::_foreach_mul_(grads, at::Scalar(weights[0]));
      }
      at::Tensor part = loss.detach();
      if (part.scalar_type() != at::kFloat) part = part.to(at::kFloat);
      part = part * weights[i];
      loss_sum = loss_sum.defined() ? loss_sum + part : part;
    }
    if (measure) {
      int64_t total = 0;
      for (int64_t size : noise_sizes) total += size;
      noise_.add(noise_sizes.front(), std::move(small_sq), total,
                 squared_gradient_norm(parameters),
                 scaler_.enabled() ? scaler_.current_scale() : 1.0);
    }
    if (successive) measure_successive(static_cast<double>(noise_sizes.front()));
    return loss_sum;
  } catch (...) {
    workload_.optimizer().zero_grad(/*set_to_none=*/true);
    throw;
  }
}

void TrainingStep::measure_successive(double size) {
  if (auto measurement =
          successive_.measure(workload_.model().parameters(), size,
                              scaler_.enabled() ? scaler_.scale_tensor() : at::Tensor())) {
    noise_.add(std::move(*measurement));
  }
}

at::Tensor TrainingStep::run(const Batch& batch, int64_t step_index) {
  at::Tensor loss = backward(batch, step_index);
  apply();
  return loss;
}

at::Tensor TrainingStep::accumulate(const Batch& host_batch, double* data_seconds) {
  const int64_t total = host_batch.size();
  TORCH_CHECK(total > 0, "TrainingStep: an empty batch");
  const int64_t micro = options_.micro_batch_size() > 0 ? options_.micro_batch_size() : total;
  const bool non_blocking = host_batch.inputs.at(0).is_pinned();
  at::Tensor loss_sum;
  for (int64_t begin = 0; begin < total; begin += micro) {
    const int64_t end = std::min(total, begin + micro);
    // Without accumulation the share is 1: no views and no extra ops on a
    // hot, tiny step.
    const bool whole = end - begin == total;
    const double fetch_start_s = clock_->now_s();
    const Batch batch = to_device(whole ? host_batch : narrow_batch(host_batch, begin, end - begin),
                                  device_, non_blocking);
    if (data_seconds != nullptr) *data_seconds += clock_->now_s() - fetch_start_s;
    at::Tensor loss;
    {
      AutocastGuard autocast(device_.type(), options_.amp());
      loss = workload_.compute_loss(batch);
    }
    // Mean over the logical batch = sum of micro-batch means × their shares
    // (1 / accumulation_steps when the micro-batches are equal).
    const double share = static_cast<double>(end - begin) / static_cast<double>(total);
    scaler_.scale(whole ? loss : loss * share).backward();
    at::Tensor part = loss.detach();
    if (part.scalar_type() != at::kFloat) part = part.to(at::kFloat);
    if (!whole) part = part * share;
    loss_sum = loss_sum.defined() ? loss_sum + part : part;
  }
  return loss_sum;
}

at::Tensor TrainingStep::accumulate_measuring_noise(const Batch& batch, int64_t small_batch,
                                                    double* data_seconds) {
  // The first `small_batch` samples are back-propagated alone and their
  // gradient's squared norm taken, then the rest; the gradients are rescaled
  // around the second part so that they end as one logical batch's mean.
  const int64_t total = batch.size();
  TORCH_CHECK(small_batch >= 1 && small_batch < total,
              "TrainingStep: the noise-scale batch must be in [1, ", total - 1, "], got ",
              small_batch);
  const Batch first = narrow_batch(batch, 0, small_batch);
  const Batch rest = narrow_batch(batch, small_batch, total - small_batch);
  const std::vector<at::Tensor> parameters = workload_.model().parameters();
  const double m = static_cast<double>(small_batch);
  const double b = static_cast<double>(total);

  const at::Tensor first_loss = accumulate(first, data_seconds);
  at::Tensor small_sq = squared_gradient_norm(parameters);
  // Weigh it m/(b−m) against the rest's mean gradient, which the second call
  // adds with weight 1; scaling the sum by (b−m)/b then leaves
  // (m/b)·g_first + ((b−m)/b)·g_rest: the logical batch's mean gradient.
  {
    std::vector<at::Tensor> grads = defined_gradients(parameters);
    if (!grads.empty()) at::_foreach_mul_(grads, at::Scalar(m / (b - m)));
  }
  const at::Tensor rest_loss = accumulate(rest, data_seconds);
  {
    std::vector<at::Tensor> grads = defined_gradients(parameters);
    if (!grads.empty()) at::_foreach_mul_(grads, at::Scalar((b - m) / b));
  }
  at::Tensor big_sq = squared_gradient_norm(parameters);
  noise_.add(small_batch, std::move(small_sq), total, std::move(big_sq),
             scaler_.enabled() ? scaler_.current_scale() : 1.0);
  return first_loss * (m / b) + rest_loss * ((b - m) / b);
}

}  // namespace batchtune
