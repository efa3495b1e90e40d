#include "batchtune/step/noise_scale.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>


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
  window_.emplace_back(gradient_sq, trace);
  if (window_.size() > kNoiseScaleWindow) window_.erase(window_.begin());
}

std::optional<NoiseInterval> NoiseScaleEstimator::interval() const {
  const size_t n = window_.size();
  if (n < 3) return std::nullopt;
  double sum_g = 0;
  double sum_t = 0;
  for (const auto& [g, t] : window_) {
    sum_g += g;
    sum_t += t;
  }
  if (!(sum_g > 0)) return std::nullopt;
  // Jackknife of the ratio of means: leave each measurement out once.
  std::vector<double> leave_one_out;
  for (const auto& [g, t] : window_) {
    const double rest_g = sum_g - g;
    if (!(rest_g > 0)) return std::nullopt;
    leave_one_out.push_back((sum_t - t) / rest_g);
  }
  double mean = 0;
  for (double v : leave_one_out) mean += v;
  mean /= static_cast<double>(n);
  double sq = 0;
  for (double v : leave_one_out) sq += (v - mean) * (v - mean);
  const double se = std::sqrt(static_cast<double>(n - 1) / static_cast<double>(n) * sq);
  const double estimate = sum_t / sum_g;
  return NoiseInterval{std::max(0.0, estimate - se), std::max(0.0, estimate + se)};
}

nlohmann::json NoiseScaleEstimator::state() const {
  return {{"ema_gradient_sq", ema_gradient_sq_},
          {"ema_trace", ema_trace_},
          {"decay_power", decay_power_},
          {"measurements", measurements_},
          {"window", window_}};
}

void NoiseScaleEstimator::load_state(const nlohmann::json& state) {
  ema_gradient_sq_ = state.at("ema_gradient_sq").get<double>();
  ema_trace_ = state.at("ema_trace").get<double>();
  decay_power_ = state.at("decay_power").get<double>();
  measurements_ = state.at("measurements").get<int64_t>();
  window_ = state.value("window", std::vector<std::pair<double, double>>{});
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

NoiseScaleReading read_noise_scale(const NoiseScaleEstimator& estimator) {
  NoiseScaleReading r;
  r.measurements = estimator.measurements();
  if (r.measurements == 0) {
    r.note = "no measurement was made";
    return r;
  }
  const double gradient_sq = estimator.gradient_sq_norm().value_or(0);
  const double trace = estimator.trace_covariance().value_or(0);
  if (gradient_sq > 0 && trace > 0) {
    r.noise_scale = trace / gradient_sq;
    return r;
  }
  // Either estimate is a difference of noisy norms: under load, at a small
  // batch or early in a run it can stay at or below 0 on real labels.
  r.note = fmt::format(
      "noise scale unresolved: after {} measurements the smoothed |G|² is {:.3g} and "
      "tr(Σ) {:.3g}, not both positive, so the gradient could not be told from its "
      "noise; a larger batch or a longer run would resolve it",
      r.measurements, gradient_sq, trace);
  return r;
}

double statistical_efficiency(double noise_scale, double base_batch, double batch) {
  TORCH_CHECK(noise_scale >= 0 && base_batch > 0 && batch > 0,
              "statistical_efficiency: need noise scale >= 0 and positive batches, got ",
              noise_scale, ", ", base_batch, ", ", batch);
  if (std::isinf(noise_scale)) return 1;  // all noise: every sample counts alike
  return (noise_scale + base_batch) / (noise_scale + batch);
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

int64_t NoiseScaleTracker::small_batch(int64_t step, int64_t global_batch, int64_t micro_batch,
                                       int64_t split_every) {
  TORCH_CHECK(split_every >= 1, "NoiseScaleTracker::small_batch: split_every must be at least 1");
  if (global_batch > micro_batch) return micro_batch;
  if (global_batch >= kNoiseScaleMinSplitBatch && step % split_every == 0) {
    return global_batch / 2;
  }
  return 0;
}

void NoiseScaleTracker::add(double small_batch, at::Tensor small_sq_norm, double big_batch,
                            at::Tensor big_sq_norm, double loss_scale) {
  pending_.push_back(
      {small_batch, std::move(small_sq_norm), big_batch, std::move(big_sq_norm), loss_scale});
  if (pending_.size() >= kMaxPendingNoiseMeasurements) flush();
}

void NoiseScaleTracker::add(NoiseMeasurement measurement, double loss_scale) {
  add(measurement.small_batch, std::move(measurement.small_sq_norm), measurement.big_batch,
      std::move(measurement.big_sq_norm), loss_scale);
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
    estimator_.add(pending_[i].small_batch, v[2 * i] / scale_sq, pending_[i].big_batch,
                   v[2 * i + 1] / scale_sq);
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

}  // namespace batchtune
