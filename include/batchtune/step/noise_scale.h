#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>
#include <c10/core/Device.h>
#include <torch/arg.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace batchtune {

/// Weight of the past in the moving averages of the two estimates: about the
/// last 1 / (1 − 0.95) = 20 measurements count. Single measurements of
/// |G_small|² − |G_big|² are noisy (McCandlish et al. smooth them too); a
/// longer memory would lag behind a noise scale that grows as training goes.
constexpr double kDefaultNoiseScaleDecay = 0.95;
/// Measurements the tracker keeps as device scalars before it reads them
/// all in one copy: a synchronisation per this many steps at most, and a
/// bounded queue when nothing asks for the noise scale for a long time.
constexpr size_t kMaxPendingNoiseMeasurements = 64;
/// Without accumulation (nothing to compare for free), one optimizer step in
/// this many runs its logical batch as two halves to measure the noise scale.
/// A split step of a small model costs about two steps (launch overheads,
/// not FLOPs, dominate), so one in 10 slowed an MLP on Fashion-MNIST by
/// ~10 %; one in 50 keeps it near 2 % (`bench/train_overhead`).
constexpr int64_t kNoiseScaleEveryWithoutAccumulation = 50;
/// The smallest logical batch split in two without accumulation: halves of
/// at least 2 samples, since a batch of 1 through BatchNorm in training
/// fails where the step itself ran (resnet18 at 32x32 and below).
constexpr int64_t kNoiseScaleMinSplitBatch = 4;

/// Raw measurements the estimator keeps for the spread of its estimate.
constexpr size_t kNoiseScaleWindow = 32;

/// A range the noise scale likely lies in: ±1 jackknife standard error of
/// the ratio of the last `kNoiseScaleWindow` measurements' means, clamped at
/// 0. One, not two: single measurements are so noisy that ±2 reaches 0 for
/// most of a run (lenet, 30 measurements: 97, ±2 SE [0, 203]), and a
/// decision at 0 never changes the batch.
struct NoiseInterval {
  double low = 0;
  double high = 0;
};

struct NoiseScaleOptions {
  /// EMA decay of |G|² and tr(Σ), each before the ratio is taken.
  TORCH_ARG(double, decay) = kDefaultNoiseScaleDecay;
};

/// The gradient noise scale B_simple = tr(Σ) / |G|² (McCandlish et al. 2018,
/// "An Empirical Model of Large-Batch Training", appendix A.1): Σ the
/// per-sample gradient covariance, G the true gradient. It is estimated from
/// the squared norms of mean gradients measured at two batch sizes on the
/// same parameters, with the unbiased estimators
///
///   |G|²  ≈ (B_big·|G_big|² − B_small·|G_small|²) / (B_big − B_small)
///   tr(Σ) ≈ (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)
///
/// each smoothed by an exponential moving average (bias-corrected as Adam
/// does) before the ratio is taken. The two sizes come from wherever two
/// gradients of the same step exist: a micro-batch against its logical batch
/// (gradient accumulation), one rank's gradient against the all-reduced one
/// (data parallelism: B_small = the local batch, B_big = the global batch), or
/// a logical batch split in two for the purpose.
///
/// Example:
/// ```
///   batchtune::NoiseScaleEstimator noise;
///   noise.add(32, small_sq_norm, 128, big_sq_norm);  // every step
///   if (auto b = noise.noise_scale()) std::cout << "B_noise " << *b;
/// ```
class NoiseScaleEstimator {
 public:
  explicit NoiseScaleEstimator(NoiseScaleOptions options = {});

  /// One measurement: |G_small|² at batch `small_batch` and |G_big|² at
  /// `big_batch` (> `small_batch`), both mean gradients. Non-finite norms
  /// (an fp16 overflow) are ignored.
  void add(double small_batch, double small_sq_norm, double big_batch, double big_sq_norm);

  /// The raw ratio of the smoothed estimates, in samples; nullopt before
  /// the first measurement, or while the smoothed |G|² is not positive. It
  /// is negative while the tr(Σ) estimate is: `BatchAdapter` reads that as
  /// no measurable noise. What a run reports goes through
  /// `read_noise_scale`, which says such an estimate is unresolved.
  std::optional<double> noise_scale() const;
  /// The smoothed estimates themselves; nullopt before the first measurement.
  std::optional<double> gradient_sq_norm() const;
  std::optional<double> trace_covariance() const;
  /// How sure the estimate is (see `NoiseInterval`); nullopt with fewer than
  /// 3 measurements, or while the window's mean |G|² is not positive. A
  /// decision on the noise scale takes its cautious end.
  std::optional<NoiseInterval> interval() const;
  int64_t measurements() const { return measurements_; }
  /// The averages as they stand, for a checkpoint, and back.
  nlohmann::json state() const;
  void load_state(const nlohmann::json& state);

 private:
  NoiseScaleOptions options_;
  double ema_gradient_sq_ = 0;
  double ema_trace_ = 0;
  double decay_power_ = 1;  // decay^measurements, for the bias correction
  /// The last `kNoiseScaleWindow` raw (|G|², tr(Σ)) estimates, oldest first.
  std::vector<std::pair<double, double>> window_;
  int64_t measurements_ = 0;
};

/// What a run reports of the noise scale: the one rule for every path (a
/// tune's noise run, training's log lines and summary, images and text).
struct NoiseScaleReading {
  /// B_simple where the smoothed |G|² and tr(Σ) are both positive; else
  /// nullopt: unresolved, or not measured.
  std::optional<double> noise_scale;
  int64_t measurements = 0;
  /// Empty when measured; else why not, in a sentence ("no measurement was
  /// made", or the unresolved estimate with its figures and what would
  /// resolve it).
  std::string note;
  /// Measured, but the signal could not be told from its noise.
  bool unresolved() const { return !noise_scale && measurements > 0; }
};

/// Reads `estimator` by that rule.
///
/// Example:
/// ```
///   const batchtune::NoiseScaleReading r = batchtune::read_noise_scale(noise);
///   std::cout << (r.noise_scale ? std::to_string(*r.noise_scale) : r.note);
/// ```
NoiseScaleReading read_noise_scale(const NoiseScaleEstimator& estimator);

/// Statistical efficiency of global batch `batch` relative to the base batch
/// `base_batch` (Pollux, OSDI 2021): E(B) = (B_noise + B0) / (B_noise + B),
/// the progress per sample at B as a share of that at B0, for gradient noise
/// scale `noise_scale` = B_noise. 1 at B0, falling towards B0/B.
///
/// Example:
/// ```
///   batchtune::statistical_efficiency(100, 32, 32);   // 1
///   batchtune::statistical_efficiency(100, 32, 132);  // 132 / 232 = 0.569
/// ```
double statistical_efficiency(double noise_scale, double base_batch, double batch);

/// The squared L2 norm of all gradients of `parameters` together, as a float
/// scalar on their device (no synchronisation). Parameters without a
/// gradient count as zero.
at::Tensor squared_gradient_norm(const std::vector<at::Tensor>& parameters);

/// One measurement of the gradient noise scale: the squared norms of mean
/// gradients over `small_batch` and `big_batch` (samples or tokens), as
/// device scalars (still multiplied by the loss scale², when there is one).
struct NoiseMeasurement {
  double small_batch = 0;
  at::Tensor small_sq_norm;
  double big_batch = 0;
  at::Tensor big_sq_norm;
};

/// The noise-scale estimator as the training loop feeds it: measurements
/// stay device scalars until the noise scale is read, so measuring costs no
/// synchronisation per step. `small_batch` says which steps measure.
class NoiseScaleTracker {
 public:
  explicit NoiseScaleTracker(NoiseScaleOptions options = {}) : estimator_(options) {}

  /// The batch whose gradient to measure first on optimizer step `step`
  /// (from 0), or 0 for a step that measures nothing: the first micro-batch
  /// when there is accumulation (every step: it is free), else half the
  /// logical batch every `kNoiseScaleEveryWithoutAccumulation` steps (from
  /// `kNoiseScaleMinSplitBatch` samples).
  /// `split_every` says how often a step without accumulation is split
  /// (`train --adapt` measures more often than the default).
  static int64_t small_batch(int64_t step, int64_t global_batch, int64_t micro_batch,
                             int64_t split_every = kNoiseScaleEveryWithoutAccumulation);

  /// Queues one measurement; squared norms are scalars on the device,
  /// divided by `loss_scale`² when read (gradients of a scaled loss).
  void add(double small_batch, at::Tensor small_sq_norm, double big_batch,
           at::Tensor big_sq_norm, double loss_scale = 1);
  void add(NoiseMeasurement measurement, double loss_scale = 1);

  /// B_simple after reading the queued measurements (one synchronisation).
  std::optional<double> noise_scale();
  /// The estimator, for measurements made elsewhere (data parallelism adds
  /// the local against the all-reduced gradient here).
  NoiseScaleEstimator& estimator();

 private:
  struct Pending {
    double small_batch;
    at::Tensor small_sq_norm;
    double big_batch;
    at::Tensor big_sq_norm;
    double loss_scale;
  };
  void flush();

  NoiseScaleEstimator estimator_;
  std::vector<Pending> pending_;
};

}  // namespace batchtune
