#include "batchtune/training/noise_scale.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <cmath>

#include "batchtune/data/dataset.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/step/loss_scaler.h"
#include "batchtune/plan/plan.h"
#include "batchtune/training/trainer.h"
#include "batchtune/step/workload.h"
#include "step/training_snapshot.h"

namespace batchtune {

NoiseScaleEstimator::NoiseScaleEstimator(NoiseScaleOptions options) : options_(options) {
  TORCH_CHECK(options_.decay() >= 0 && options_.decay() < 1,
              "NoiseScaleEstimator: decay must be in [0, 1), got ", options_.decay());
}

void NoiseScaleEstimator::add(double small_batch, double small_sq_norm, double big_batch,
                              double big_sq_norm) {
  TORCH_CHECK(small_batch > 0 && big_batch > small_batch,
              "NoiseScaleEstimator::add: need 0 < small batch < big batch, got ", small_batch,
              " and ", big_batch);
  if (!std::isfinite(small_sq_norm) || !std::isfinite(big_sq_norm)) return;
  // McCandlish et al. 2018, appendix A.1: unbiased for |G|² and tr(Σ), since
  // E|G_B|² = |G|² + tr(Σ)/B for a mean gradient over B samples.
  const double gradient_sq =
      (big_batch * big_sq_norm - small_batch * small_sq_norm) / (big_batch - small_batch);
  const double trace = (small_sq_norm - big_sq_norm) / (1 / small_batch - 1 / big_batch);
  const double d = options_.decay();
  ema_gradient_sq_ = d * ema_gradient_sq_ + (1 - d) * gradient_sq;
  ema_trace_ = d * ema_trace_ + (1 - d) * trace;
  decay_power_ *= d;
  ++measurements_;
}

std::optional<double> NoiseScaleEstimator::gradient_sq_norm() const {
  if (measurements_ == 0) return std::nullopt;
  return ema_gradient_sq_ / (1 - decay_power_);
}

std::optional<double> NoiseScaleEstimator::trace_covariance() const {
  if (measurements_ == 0) return std::nullopt;
  return ema_trace_ / (1 - decay_power_);
}

std::optional<double> NoiseScaleEstimator::noise_scale() const {
  if (measurements_ == 0 || !(ema_gradient_sq_ > 0)) return std::nullopt;
  // The bias corrections of the two averages are the same factor: it cancels.
  return ema_trace_ / ema_gradient_sq_;
}

at::Tensor squared_gradient_norm(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kFloat));
  const std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2);
  return at::stack(norms).to(at::kFloat).square().sum();
}

int64_t NoiseScaleTracker::small_batch(int64_t step, int64_t global_batch, int64_t micro_batch) {
  if (global_batch > micro_batch) return micro_batch;
  if (global_batch >= 2 && step % kNoiseScaleEveryWithoutAccumulation == 0) {
    return global_batch / 2;
  }
  return 0;
}

void NoiseScaleTracker::add(int64_t small_batch, at::Tensor small_sq_norm, int64_t big_batch,
                            at::Tensor big_sq_norm, double loss_scale) {
  pending_.push_back(
      {small_batch, std::move(small_sq_norm), big_batch, std::move(big_sq_norm), loss_scale});
  if (pending_.size() >= kMaxPendingNoiseMeasurements) flush();
}

void NoiseScaleTracker::flush() {
  if (pending_.empty()) return;
  // One copy to the host for all queued measurements.
  std::vector<at::Tensor> values;
  for (const auto& p : pending_) {
    values.push_back(p.small_sq_norm.reshape({1}));
    values.push_back(p.big_sq_norm.reshape({1}));
  }
  const at::Tensor host = at::cat(values).to(at::kCPU).to(at::kDouble);
  const double* v = host.data_ptr<double>();
  for (size_t i = 0; i < pending_.size(); ++i) {
    const double scale_sq = pending_[i].loss_scale * pending_[i].loss_scale;
    estimator_.add(static_cast<double>(pending_[i].small_batch), v[2 * i] / scale_sq,
                   static_cast<double>(pending_[i].big_batch), v[2 * i + 1] / scale_sq);
  }
  pending_.clear();
}

std::optional<double> NoiseScaleTracker::noise_scale() {
  flush();
  return estimator_.noise_scale();
}

NoiseScaleEstimator& NoiseScaleTracker::estimator() {
  flush();
  return estimator_;
}

at::Tensor accumulate_gradients_measuring_noise(Workload& workload, const Batch& batch,
                                                int64_t micro_batch_size, int64_t small_batch,
                                                AmpMode amp, const LossScaler& scaler,
                                                c10::Device device, NoiseScaleTracker& tracker,
                                                double* data_seconds) {
  const int64_t total = batch.size();
  TORCH_CHECK(small_batch >= 1 && small_batch < total,
              "accumulate_gradients_measuring_noise: the small batch must be in [1, ",
              total - 1, "], got ", small_batch);
  const Batch first = narrow_batch(batch, 0, small_batch);
  const Batch rest = narrow_batch(batch, small_batch, total - small_batch);
  const std::vector<at::Tensor> parameters = workload.model().parameters();
  const auto defined_grads = [&] {
    std::vector<at::Tensor> grads;
    for (const auto& p : parameters) {
      if (p.grad().defined()) grads.push_back(p.grad());
    }
    return grads;
  };
  const double m = static_cast<double>(small_batch);
  const double b = static_cast<double>(total);

  // First part alone: the gradients are its mean gradient (× the loss scale).
  const at::Tensor first_loss = accumulate_gradients(workload, first, micro_batch_size, amp, scaler,
                                                     device, data_seconds);
  at::Tensor small_sq = squared_gradient_norm(parameters);
  // Weigh it m/(b−m) against the rest's mean gradient, which the second call
  // adds with weight 1; scaling the sum by (b−m)/b then leaves
  // (m/b)·g_first + ((b−m)/b)·g_rest: the logical batch's mean gradient.
  {
    std::vector<at::Tensor> grads = defined_grads();
    if (!grads.empty()) at::_foreach_mul_(grads, at::Scalar(m / (b - m)));
  }
  const at::Tensor rest_loss = accumulate_gradients(workload, rest, micro_batch_size, amp, scaler,
                                                    device, data_seconds);
  {
    std::vector<at::Tensor> grads = defined_grads();
    if (!grads.empty()) at::_foreach_mul_(grads, at::Scalar((b - m) / b));
  }
  at::Tensor big_sq = squared_gradient_norm(parameters);
  tracker.add(small_batch, std::move(small_sq), total, std::move(big_sq),
              scaler.enabled() ? scaler.current_scale() : 1.0);
  return first_loss * (m / b) + rest_loss * ((b - m) / b);
}

NoiseScaleMeasurement measure_noise_scale(Workload& workload, DeviceMemory& memory,
                                          const Dataset& data, int64_t micro_batch, double lr,
                                          int64_t steps, uint64_t seed) {
  TORCH_CHECK(micro_batch >= 1 && steps >= 1, "measure_noise_scale: need a micro-batch and steps");
  // Never a logical batch larger than the data.
  const int64_t micro = std::min(micro_batch, data.size() / kNoiseRunAccumulation);
  if (micro < 1) {
    throw Error(fmt::format("--data: {} has too few samples to measure the noise scale (needs "
                            "at least {}); use more data",
                            data.describe(), kNoiseRunAccumulation));
  }
  const int64_t global = micro * kNoiseRunAccumulation;
  Plan plan = make_plan(
      PlanOptions().micro_batch_size(micro).target_batch(global).base_lr(lr).base_batch(global));
  NoiseScaleMeasurement out;
  out.small_batch = micro;
  out.big_batch = global;

  auto& optimizer = workload.optimizer();
  std::vector<double> lrs;
  for (auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
  TrainingSnapshot snapshot(workload.model(), optimizer);
  const auto start = std::chrono::steady_clock::now();
  {
    Trainer trainer(workload, memory, plan, data, nullptr,
                    TrainOptions().steps(steps).seed(seed).log_every(0));
    const TrainSummary summary = trainer.run();
    out.steps = summary.steps;
    out.noise_scale = summary.noise_scale;
    const NoiseScaleEstimator& estimator = trainer.noise_scale().estimator();
    out.measurements = estimator.measurements();
    out.gradient_sq_norm = estimator.gradient_sq_norm();
    out.trace_covariance = estimator.trace_covariance();
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  snapshot.restore();
  for (size_t i = 0; i < lrs.size(); ++i) optimizer.param_groups()[i].options().set_lr(lrs[i]);
  memory.release_cached();
  // A run a signal stopped is no measurement: the caller marks its run incomplete.
  throw_if_interrupted();
  if (!out.noise_scale) {
    out.note = out.measurements == 0
                   ? "no measurement was made"
                   : fmt::format("the smoothed |G|² after {} measurements is not positive "
                                 "({:.3g}): the gradient is indistinguishable from its noise "
                                 "(random labels?), so the noise scale is unbounded",
                                 out.measurements, out.gradient_sq_norm.value_or(0));
  }
  return out;
}

}  // namespace batchtune
