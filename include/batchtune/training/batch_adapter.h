#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "batchtune/plan/plan.h"
#include "batchtune/step/noise_scale.h"

namespace batchtune {

/// Optimizer steps between two decisions of `train --adapt`: long enough
/// to time a batch size and gather several noise measurements, short enough
/// to follow a noise scale that grows over a few hundred steps.
constexpr int64_t kDefaultAdaptEvery = 50;
/// The largest global batch `--adapt` grows to, as a multiple of the batch it
/// starts from (when no `--adapt-max-batch` says otherwise).
constexpr int64_t kDefaultAdaptGrowth = 32;
/// A change must promise this much more goodput than staying (hysteresis):
/// the estimates are noisy, and every change costs a few steps of lr ramp.
constexpr double kAdaptMinGain = 0.05;
/// Noise measurements before the first decision (the estimate's EMA is
/// bias-corrected, but one or two measurements are too noisy to act on).
constexpr int64_t kAdaptMinMeasurements = 4;
/// Optimizer steps over which the lr moves from its old value to the new
/// one after a change: a jump would hit Adam's moments, gathered at the old
/// scale, all at once.
constexpr int64_t kAdaptLrRampSteps = 20;
/// A window after the start or a change times its steps from this share of
/// it on (a tenth: 5 of 50 steps): the first steps at a new batch shape pay
/// for new kernels and allocations that the steps after them do not, and
/// would make the new batch look slower than it runs.
constexpr int64_t kAdaptSettleShare = 10;
/// Where nothing else measures the noise scale (no accumulation, no ranks,
/// no previous step kept), `--adapt` splits one step in this many; a single
/// process measures every step against the previous one
/// (`SuccessiveGradients`) and data-parallel ranks every step against each
/// other, so neither splits.
constexpr int64_t kAdaptNoiseEvery = 10;

/// What the lr of a new global batch B follows under `--adapt` (the plan's
/// rule f, linear or sqrt, applied to it): `kGain`, the AdaScale gain
/// r(B) = (B/B0)·E(B), the default; `kBatch`, the batch ratio B/B0 alone, as
/// the plan scales a fixed batch (`--adapt-lr batch`, for comparison).
enum class AdaptLr { kGain, kBatch };

/// `rule`'s word: "gain" or "batch".
std::string adapt_lr_name(AdaptLr rule);
/// The rule `word` names ("gain" or "batch"); throws an `OptionError`
/// naming `Option::kAdaptLr` otherwise.
AdaptLr parse_adapt_lr(const std::string& word);

/// A global batch's throughput as the tune before training measured it:
/// the median samples (or tokens) per second and its 95 % interval.
struct TunedSpeed {
  double median = 0;
  double low = 0;
  double high = 0;
  TunedSpeed() = default;
  /// A reading without an interval (its ends at the median).
  TunedSpeed(double samples_per_s)  // NOLINT(google-explicit-constructor): a profile of medians
      : median(samples_per_s), low(samples_per_s), high(samples_per_s) {}
  TunedSpeed(double samples_per_s, double low_end, double high_end)
      : median(samples_per_s), low(low_end), high(high_end) {}
};

/// The tune's throughput by global batch.
using SpeedProfile = std::map<int64_t, TunedSpeed>;

/// A batch not yet run, as the profile expects it against the batch in
/// force: `ratio` of the medians, and `hopeful`, the largest ratio the two
/// intervals allow (the candidate's high end over the current's low end).
struct ExpectedSpeed {
  double ratio = 1;
  double hopeful = 1;
};

/// How `train --adapt` moves the global batch.
struct AdaptOptions {
  /// Optimizer steps between decisions (and the window a batch is timed over).
  TORCH_ARG(int64_t, every) = kDefaultAdaptEvery;
  /// The largest global batch; 0 for `kDefaultAdaptGrowth` × the start.
  TORCH_ARG(int64_t, max_global_batch) = 0;
  /// The smallest global batch; 0 for the start / `kDefaultAdaptGrowth`
  /// (rounded down to a multiple of the world size, at least one sample a
  /// rank). The start itself keeps the batch from shrinking below it.
  TORCH_ARG(int64_t, min_global_batch) = 0;
  /// The smallest relative goodput gain that makes a change.
  TORCH_ARG(double, min_gain) = kAdaptMinGain;
  TORCH_ARG(int64_t, min_measurements) = kAdaptMinMeasurements;
  TORCH_ARG(int64_t, lr_ramp_steps) = kAdaptLrRampSteps;
  /// What the lr follows (`AdaptLr`).
  TORCH_ARG(AdaptLr, lr) = AdaptLr::kGain;
  /// What a global batch counts, as the reasons name it: "samples", or
  /// "tokens" for text trained by a token budget.
  TORCH_ARG(std::string, unit) = "samples";
  /// The throughput of global batches as the tune before training measured
  /// them (its sweep, with intervals); empty for none. A batch not yet run
  /// is then expected at today's speed times its ratio to the batch in
  /// force in the profile, where both are in it, and tried only where the
  /// hopeful end of that ratio (its intervals') wins, capped at the bound
  /// of a batch no tune measured: not on that bound where the tune can say
  /// better, and not on a median that the tune's noise could have put on
  /// the wrong side.
  TORCH_ARG(SpeedProfile, speed_profile) = {};
};

/// Checks `options` on their own (the steps between decisions, the largest
/// global batch), as `BatchAdapter` does before it compares them with the
/// batch it starts from: a front end can refuse them before a tune runs.
/// Throws an `OptionError` naming the option.
void check_adapt_options(const AdaptOptions& options);

/// The lr after a change: from the lr in force to the new one, linearly
/// over `kAdaptLrRampSteps` optimizer steps.
struct LrRamp {
  double from = 0;
  int64_t start = -1;  ///< the optimizer step of the change; -1 for none yet
  /// The lr of optimizer step `step` on its way to `to`.
  double at(int64_t step, double to) const;
  /// A change at `step` to a new lr, from the lr step `step` had.
  void restart(int64_t step, double lr_before);
};

/// One row of the batch schedule: from optimizer step `step` on, the run
/// trains at this batch and lr. JSON (`batch_schedule`): these names.
struct BatchChange {
  int64_t step = 0;
  int64_t global_batch_size = 0;
  int64_t micro_batch_size = 0;     ///< per rank
  int64_t accumulation_steps = 0;
  double lr = 0;                    ///< the lr after the ramp (and warm-up)
  std::optional<double> noise_scale;  ///< B_simple the decision read; none at the start
  /// Why, with the numbers: the goodput of both sizes, or "exploring".
  std::string reason;
};

nlohmann::json to_json(const BatchChange& change);
BatchChange batch_change_from_json(const nlohmann::json& j);

/// The adaptive-batch policy of `train --adapt`, as pure decisions over what
/// the loop measured: the gradient noise scale (B_noise) and the throughput
/// of each global batch it ran.
///
/// Every `every` steps it compares the goodput (Pollux, OSDI 2021:
/// throughput × statistical efficiency E(B) = (B_noise + B0) / (B_noise + B),
/// B0 the batch it started from) of the current global batch with half and
/// twice it, within [min, max], and changes when one promises `min_gain`
/// more. Throughput is measured, never modelled: a batch not yet run is tried
/// for one window (exploring) unless its expected throughput would not be
/// enough: today's times the ratio the tune measured between the two
/// (`AdaptOptions::speed_profile`), or without a profile the most hopeful
/// (twice today's for a larger batch, today's for a smaller one); after the
/// window, it stays only where its measured goodput is higher, else the run
/// goes back. A start too large for the noise early in
/// training (a tune's throughput-golden batch) so shrinks until the
/// efficiency it gains no longer pays for the speed it loses. Where the
/// micro-batch is capped (`cap_micro_batch`, learned from an out-of-memory)
/// a change moves the accumulation alone and runs at today's throughput:
/// a larger batch then never pays and a smaller one is decided on today's
/// speed, without a try.
///
/// The lr follows the AdaScale gain (Johnson et al., ICML 2020): r(B) =
/// (B/B0)·E(B), between 1 and B/B0, the progress one step at B makes in steps at
/// B0; lr(B) = lr0 × f(r) with f the plan's rule (linear for SGD, sqrt for the
/// Adam family). Linear scaling by B/B0 alone overshoots while the noise
/// scale is small, when a larger batch buys little progress per step.
///
/// Example:
/// ```
///   batchtune::BatchAdapter adapter(64, 1e-3, batchtune::LrScaling::kSqrt, 1);
///   adapter.observe(64, 1.5, 3200);  // 3200 samples at batch 64 in 1.5 s
///   auto change = adapter.decide(50, 64, 1, 410.0, 12);
/// ```
class BatchAdapter {
 public:
  BatchAdapter(int64_t base_batch, double base_lr, LrScaling scaling, int64_t world_size,
               AdaptOptions options = {});

  /// The batch it started from (B0), its smallest and its largest.
  int64_t base_batch() const { return base_batch_; }
  int64_t min_global_batch() const { return min_global_; }
  int64_t max_global_batch() const { return max_global_; }
  const AdaptOptions& options() const { return options_; }

  /// `samples` trained at `global_batch` in `seconds` of training time.
  void observe(int64_t global_batch, double seconds, int64_t samples);
  /// The end of a decision window, at the run's totals so far (`seconds` of
  /// training time, `samples` or tokens trained): the window since the
  /// previous end is observed at `global_batch`, unless it was spoiled.
  void end_window(int64_t global_batch, double seconds, int64_t samples);
  /// The next window times from these totals: a change took effect later
  /// than decided (a loader that asks ahead), or a run resumed. Its first
  /// steps settle (`settles`).
  void restart_window(double seconds, int64_t samples);
  /// Counts one optimizer step; true at the step that ends the settling of
  /// a window after the start or a change (`kAdaptSettleShare`): the caller
  /// then passes its totals to `start_timing` (on a GPU, with the device's
  /// work waited for), so that the window times its steps from there.
  bool settles();
  /// The window under way times from these totals (`seconds` of training
  /// time, `samples` or tokens trained), its settling over.
  void start_timing(double seconds, int64_t samples);
  /// Samples per second measured at `global_batch`; nullopt when never run.
  std::optional<double> speed(int64_t global_batch) const;
  /// The micro-batch per rank that fits at most (an out-of-memory said so);
  /// the window under way then times no one micro-batch, and is not observed.
  void cap_micro_batch(int64_t micro_batch);
  int64_t micro_batch_cap() const { return micro_cap_; }

  /// The micro-batch and accumulation per rank for `global_batch`: the
  /// whole local batch up to the cap, else the fewest micro-batches of at
  /// most the cap that divide it.
  std::pair<int64_t, int64_t> split(int64_t global_batch) const;
  /// The lr at `global_batch` for noise scale `noise_scale` (see the class).
  double lr_for(int64_t global_batch, double noise_scale) const;

  /// The decision at optimizer step `step`, training at `global_batch`:
  /// a change, or nullopt to stay. `noise_scale` from `measurements`
  /// measurements; no change before `min_measurements`. With `interval`
  /// (how sure the estimate is), a larger batch is judged at its low end and
  /// a smaller one at its high end: an uncertain estimate keeps the batch.
  /// A change's first steps settle (`settles`) before its window times them.
  std::optional<BatchChange> decide(int64_t step, int64_t global_batch,
                                    std::optional<double> noise_scale, int64_t measurements,
                                    std::optional<NoiseInterval> interval = std::nullopt);
  /// The decision on what `noise` has measured (its estimate, count and interval).
  std::optional<BatchChange> decide(int64_t step, int64_t global_batch,
                                    const NoiseScaleEstimator& noise);

  /// What a checkpoint keeps: the speeds, the cap, the trial under way and
  /// the lr rule. Loading refuses a state of another start or lr rule.
  nlohmann::json state() const;
  void load_state(const nlohmann::json& state);

 private:
  struct Speed {
    double seconds = 0;
    int64_t samples = 0;
  };
  /// `decide` without the settling: the policy alone.
  std::optional<BatchChange> choose(int64_t step, int64_t global_batch,
                                    std::optional<double> noise_scale, int64_t measurements,
                                    std::optional<NoiseInterval> interval);
  double goodput(int64_t global_batch, double noise_scale, double samples_per_s) const;
  /// `candidate`'s speed relative to `global_batch`'s as the profile
  /// expects it; nullopt where the profile lacks either.
  std::optional<ExpectedSpeed> expected_speed(int64_t candidate, int64_t global_batch) const;
  BatchChange change_to(int64_t step, int64_t global_batch, double noise_scale,
                        std::string reason) const;

  int64_t base_batch_;
  double base_lr_;
  LrScaling scaling_;
  int64_t world_size_;
  AdaptOptions options_;
  int64_t min_global_;
  int64_t max_global_;
  int64_t micro_cap_ = 0;  // 0: none known
  std::map<int64_t, Speed> speeds_;
  /// The batch an exploration left (0 when none is under way).
  int64_t explored_from_ = 0;
  /// Where the window under way began, and whether it trained one batch.
  double window_seconds_ = 0;
  int64_t window_samples_ = 0;
  bool window_clean_ = true;
  /// Steps until the window under way starts timing (0: it is timing).
  int64_t settle_left_ = 0;
};

}  // namespace batchtune
