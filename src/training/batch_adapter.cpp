#include "batchtune/training/batch_adapter.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/step/noise_scale.h"

namespace batchtune {

nlohmann::json to_json(const BatchChange& change) {
  return {{"step", change.step},
          {"global_batch_size", change.global_batch_size},
          {"micro_batch_size", change.micro_batch_size},
          {"accumulation_steps", change.accumulation_steps},
          {"lr", change.lr},
          {"noise_scale", change.noise_scale ? nlohmann::json(*change.noise_scale) : nullptr},
          {"reason", change.reason}};
}

BatchChange batch_change_from_json(const nlohmann::json& j) {
  BatchChange c;
  c.step = j.at("step").get<int64_t>();
  c.global_batch_size = j.at("global_batch_size").get<int64_t>();
  c.micro_batch_size = j.at("micro_batch_size").get<int64_t>();
  c.accumulation_steps = j.at("accumulation_steps").get<int64_t>();
  c.lr = j.at("lr").get<double>();
  if (!j.at("noise_scale").is_null()) c.noise_scale = j.at("noise_scale").get<double>();
  c.reason = j.value("reason", "");
  return c;
}

std::string adapt_lr_name(AdaptLr rule) { return rule == AdaptLr::kBatch ? "batch" : "gain"; }

AdaptLr parse_adapt_lr(const std::string& word) {
  if (word == "gain") return AdaptLr::kGain;
  if (word == "batch") return AdaptLr::kBatch;
  throw OptionError(Option::kAdaptLr, fmt::format("must be gain or batch, got '{}'", word));
}

double LrRamp::at(int64_t step, double to) const {
  if (start < 0 || step >= start + kAdaptLrRampSteps) return to;
  const double t = static_cast<double>(step - start + 1) / kAdaptLrRampSteps;
  return from + (to - from) * t;
}

void LrRamp::restart(int64_t step, double lr_before) {
  from = lr_before;
  start = step;
}

void check_adapt_options(const AdaptOptions& options) {
  if (options.every() < 1) {
    throw OptionError(Option::kAdaptEvery,
                      fmt::format("must be at least 1 step, got {}", options.every()));
  }
  if (options.min_global_batch() < 0) {
    throw OptionError(Option::kAdaptMinBatch,
                      fmt::format("must be 0 (for the starting batch / {}) or more, got {}",
                                  kDefaultAdaptGrowth, options.min_global_batch()));
  }
  if (options.max_global_batch() < 0) {
    throw OptionError(Option::kAdaptMaxBatch,
                      fmt::format("must be 0 (for {} x the starting batch) or more, got {}",
                                  kDefaultAdaptGrowth, options.max_global_batch()));
  }
}

BatchAdapter::BatchAdapter(int64_t base_batch, double base_lr, LrScaling scaling,
                           int64_t world_size, AdaptOptions options)
    : base_batch_(base_batch),
      base_lr_(base_lr),
      scaling_(scaling),
      world_size_(world_size),
      options_(options) {
  if (base_batch_ < 1 || world_size_ < 1 || base_batch_ % world_size_ != 0) {
    throw OptionError(Option::kAdapt,
                      fmt::format("the starting global batch {} must be a positive multiple "
                                  "of the world size {}",
                                  base_batch_, world_size_));
  }
  check_adapt_options(options_);
  max_global_ = options_.max_global_batch() > 0
                    ? options_.max_global_batch()
                    : checked_product(base_batch_, kDefaultAdaptGrowth).value_or(kMaxPlanCount);
  if (max_global_ < base_batch_) {
    throw OptionError(Option::kAdaptMaxBatch,
                      fmt::format("{} is below the starting global batch {}; give at least that",
                                  max_global_, base_batch_));
  }
  const int64_t least = base_batch_ / kDefaultAdaptGrowth;
  min_global_ = options_.min_global_batch() > 0
                    ? options_.min_global_batch()
                    : std::max(world_size_, least - least % world_size_);
  if (min_global_ > base_batch_ || min_global_ % world_size_ != 0) {
    throw OptionError(Option::kAdaptMinBatch,
                      fmt::format("{} must be a multiple of the world size {} and at most the "
                                  "starting global batch {}",
                                  min_global_, world_size_, base_batch_));
  }
  settle_left_ = options_.every() / kAdaptSettleShare;  // the start's first steps
}

void BatchAdapter::observe(int64_t global_batch, double seconds, int64_t samples) {
  if (!(seconds > 0) || samples <= 0) return;
  Speed& s = speeds_[global_batch];
  s.seconds += seconds;
  s.samples += samples;
}

void BatchAdapter::end_window(int64_t global_batch, double seconds, int64_t samples) {
  if (window_clean_) observe(global_batch, seconds - window_seconds_, samples - window_samples_);
  start_timing(seconds, samples);
  window_clean_ = true;
}

void BatchAdapter::restart_window(double seconds, int64_t samples) {
  start_timing(seconds, samples);
  window_clean_ = true;
  settle_left_ = options_.every() / kAdaptSettleShare;
}

bool BatchAdapter::settles() {
  return settle_left_ > 0 && --settle_left_ == 0;
}

void BatchAdapter::start_timing(double seconds, int64_t samples) {
  window_seconds_ = seconds;
  window_samples_ = samples;
  settle_left_ = 0;
}

std::optional<double> BatchAdapter::speed(int64_t global_batch) const {
  const auto it = speeds_.find(global_batch);
  if (it == speeds_.end()) return std::nullopt;
  return static_cast<double>(it->second.samples) / it->second.seconds;
}

void BatchAdapter::cap_micro_batch(int64_t micro_batch) {
  micro_cap_ = micro_cap_ == 0 ? micro_batch : std::min(micro_cap_, micro_batch);
  window_clean_ = false;
}

std::pair<int64_t, int64_t> BatchAdapter::split(int64_t global_batch) const {
  const int64_t local = global_batch / world_size_;
  if (micro_cap_ == 0 || local <= micro_cap_) return {local, 1};
  for (int64_t accumulation = (local + micro_cap_ - 1) / micro_cap_;; ++accumulation) {
    if (local % accumulation == 0) return {local / accumulation, accumulation};
  }
}

double BatchAdapter::lr_for(int64_t global_batch, double noise_scale) const {
  const double b = static_cast<double>(global_batch);
  const double b0 = static_cast<double>(base_batch_);
  const double gain = options_.lr() == AdaptLr::kBatch
                          ? b / b0
                          : b / b0 * statistical_efficiency(noise_scale, b0, b);
  switch (scaling_) {
    case LrScaling::kLinear:
      return base_lr_ * gain;
    case LrScaling::kSqrt:
      return base_lr_ * std::sqrt(gain);
    case LrScaling::kNone:
      break;
  }
  return base_lr_;
}

double BatchAdapter::goodput(int64_t global_batch, double noise_scale,
                             double samples_per_s) const {
  return samples_per_s * statistical_efficiency(noise_scale, static_cast<double>(base_batch_),
                                                static_cast<double>(global_batch));
}

std::optional<ExpectedSpeed> BatchAdapter::expected_speed(int64_t candidate,
                                                          int64_t global_batch) const {
  const SpeedProfile& profile = options_.speed_profile();
  const auto to = profile.find(candidate);
  const auto from = profile.find(global_batch);
  if (to == profile.end() || from == profile.end() || !(from->second.median > 0)) {
    return std::nullopt;
  }
  // An end missing or on the wrong side of its median counts as the median.
  const double from_low = from->second.low > 0 && from->second.low <= from->second.median
                              ? from->second.low
                              : from->second.median;
  const double to_high = std::max(to->second.high, to->second.median);
  return ExpectedSpeed{to->second.median / from->second.median, to_high / from_low};
}

BatchChange BatchAdapter::change_to(int64_t step, int64_t global_batch, double noise_scale,
                                    std::string reason) const {
  BatchChange c;
  c.step = step;
  c.global_batch_size = global_batch;
  std::tie(c.micro_batch_size, c.accumulation_steps) = split(global_batch);
  c.lr = lr_for(global_batch, noise_scale);
  c.noise_scale = noise_scale;
  c.reason = std::move(reason);
  return c;
}

std::optional<BatchChange> BatchAdapter::decide(int64_t step, int64_t global_batch,
                                                const NoiseScaleEstimator& noise) {
  return decide(step, global_batch, noise.noise_scale(), noise.measurements(), noise.interval());
}

std::optional<BatchChange> BatchAdapter::decide(int64_t step, int64_t global_batch,
                                                std::optional<double> noise_scale,
                                                int64_t measurements,
                                                std::optional<NoiseInterval> interval) {
  std::optional<BatchChange> change =
      choose(step, global_batch, noise_scale, measurements, interval);
  // The new batch's first steps settle before its window times them.
  if (change) settle_left_ = options_.every() / kAdaptSettleShare;
  return change;
}

std::optional<BatchChange> BatchAdapter::choose(int64_t step, int64_t global_batch,
                                                std::optional<double> noise_scale,
                                                int64_t measurements,
                                                std::optional<NoiseInterval> interval) {
  if (!noise_scale || measurements < options_.min_measurements()) return std::nullopt;
  const std::optional<double> here = speed(global_batch);
  if (!here) return std::nullopt;
  // Early estimates can dip below 0 (a trace estimate is a difference of
  // noisy norms): no measurable noise.
  const double ns = std::max(0.0, *noise_scale);
  // The cautious end of the estimate for each direction: a larger batch pays
  // only where the noise is high, a smaller one only where it is low.
  const double low = interval ? std::min(interval->low, ns) : ns;
  const double high = interval ? std::max(interval->high, ns) : ns;
  const std::string noise_words =
      interval ? fmt::format("noise scale {:.0f}, likely {:.0f}-{:.0f}, {} measurements", ns, low,
                             high, measurements)
               : fmt::format("noise scale {:.0f}, {} measurements", ns, measurements);
  const auto words = [&](int64_t batch, double samples_per_s, double at) {
    return fmt::format("global batch {}: {:.0f} {}/s x efficiency {:.3f} = {:.0f}", batch,
                       samples_per_s, options_.unit(),
                       statistical_efficiency(at, static_cast<double>(base_batch_),
                                              static_cast<double>(batch)),
                       goodput(batch, at, samples_per_s));
  };

  // An exploration's window is over: the larger batch stays only where it
  // measured better, at the low end of the noise.
  if (explored_from_ != 0) {
    const int64_t from = explored_from_;
    explored_from_ = 0;
    // The cautious end for the batch tried: low for a larger, high for a smaller.
    const double at = global_batch > from ? low : high;
    const double before = goodput(from, at, *speed(from));
    if (goodput(global_batch, at, *here) >= before) return std::nullopt;
    return change_to(step, from, ns,
                     fmt::format("back to {} after trying {}: {} against {} ({})", from,
                                 global_batch, words(from, *speed(from), at),
                                 words(global_batch, *here, at), noise_words));
  }

  // The better of half and twice the batch: measured, or tried for a window.
  std::optional<BatchChange> best;
  bool exploring = false;  // `best` is a try, not a measured win
  double best_gain = 1 + options_.min_gain();
  for (const int64_t candidate : {global_batch / 2, global_batch * 2}) {
    if (candidate < min_global_ || candidate > max_global_ || candidate % world_size_ != 0 ||
        candidate == global_batch) {
      continue;
    }
    const double at = candidate > global_batch ? low : high;
    const double current = goodput(global_batch, at, *here);
    const bool same_micro = split(candidate).first == split(global_batch).first;
    // Accumulation alone: a smaller batch runs at today's throughput.
    std::optional<double> measured = speed(candidate);
    if (!measured && same_micro && candidate < global_batch) measured = *here;
    if (measured) {
      const double gain = goodput(candidate, at, *measured) / current;
      if (gain > best_gain) {
        best_gain = gain;
        exploring = false;
        best = change_to(step, candidate, ns,
                         fmt::format("{} against {} ({})", words(candidate, *measured, at),
                                     words(global_batch, *here, at), noise_words));
      }
      continue;
    }
    // Not run yet: expected at the tune's ratio of the two speeds where
    // it measured both; else a larger batch whose micro-batch grows may run
    // up to twice as fast per sample, a smaller one at most as fast (per
    // sample, a smaller micro-batch is rarely faster). Try it for one window
    // when, at that throughput, it could win. A larger batch by
    // accumulation alone runs at today's throughput and is less efficient:
    // no try.
    if (same_micro) continue;
    const bool larger = candidate > global_batch;
    // The tune's ratio at the hopeful end of its intervals, never past the
    // bound of a batch no tune measured: a sweep too noisy to say more says
    // no more than no sweep.
    const double most_hopeful = larger ? 2.0 : 1.0;
    const std::optional<ExpectedSpeed> expected = expected_speed(candidate, global_batch);
    const double factor = expected ? std::min(expected->hopeful, most_hopeful) : most_hopeful;
    const double bound = goodput(candidate, at, factor * *here);
    if (!best && bound / current > best_gain) {
      exploring = true;
      const std::string how =
          !expected ? fmt::format("at up to {} throughput", larger ? "twice the" : "the same")
          : expected->hopeful > expected->ratio
              ? fmt::format("at up to {:.2f}x today's throughput (the tune measured {:.2f}x, "
                            "its intervals allow {:.2f}x)",
                            factor, expected->ratio, expected->hopeful)
              : fmt::format("at the {:.2f}x today's throughput the tune measured",
                            expected->ratio);
      best = change_to(step, candidate, ns,
                       fmt::format("trying global batch {} for {} steps: {} its goodput could "
                                   "reach {:.0f} against {} ({})",
                                   candidate, options_.every(), how, bound,
                                   words(global_batch, *here, at), noise_words));
    }
  }
  if (exploring) explored_from_ = global_batch;
  return best;
}

nlohmann::json BatchAdapter::state() const {
  nlohmann::json speeds = nlohmann::json::array();
  for (const auto& [batch, s] : speeds_) {
    speeds.push_back({{"global_batch_size", batch}, {"seconds", s.seconds}, {"samples", s.samples}});
  }
  nlohmann::json profile = nlohmann::json::array();
  for (const auto& [batch, speed] : options_.speed_profile()) {
    profile.push_back({{"global_batch_size", batch},
                       {"samples_per_s", speed.median},
                       {"low", speed.low},
                       {"high", speed.high}});
  }
  return {{"base_batch", base_batch_},
          {"every", options_.every()},
          {"min_global_batch", min_global_},
          {"max_global_batch", max_global_},
          {"micro_batch_cap", micro_cap_},
          {"explored_from", explored_from_},
          {"lr_rule", adapt_lr_name(options_.lr())},
          {"speeds", speeds},
          {"speed_profile", profile}};
}

void BatchAdapter::load_state(const nlohmann::json& state) {
  if (state.at("base_batch").get<int64_t>() != base_batch_) {
    throw OptionError(Option::kResume,
                      fmt::format("the checkpoint's {} run started at global batch {}, this one "
                                  "at {}; resume with the same plan",
                                  mention(Option::kAdapt), state.at("base_batch").get<int64_t>(),
                                  base_batch_));
  }
  // A state saved before the rule was kept followed the gain.
  const std::string rule = state.value("lr_rule", adapt_lr_name(AdaptLr::kGain));
  if (rule != adapt_lr_name(options_.lr())) {
    throw OptionError(Option::kResume,
                      fmt::format("the checkpoint's {} run moved its lr by the {} rule, this one "
                                  "by the {}; resume with {} {}",
                                  mention(Option::kAdapt), rule, adapt_lr_name(options_.lr()),
                                  mention(Option::kAdaptLr), rule));
  }
  // The bounds the run kept: a resume under others would train outside
  // them (global batch 8 under a new minimum of 16). A state saved before
  // they were kept is not compared. Another window (`every`) applies from
  // the resume on, and the trainer says so.
  const auto same = [&](const char* field, int64_t here, Option option, const char* verb,
                        const char* unit) {
    if (!state.contains(field)) return;
    const auto was = state.at(field).get<int64_t>();
    if (was == here) return;
    throw OptionError(Option::kResume,
                      fmt::format("the checkpoint's {} run {} {}{}, this one {}{}; resume with "
                                  "{} {}",
                                  mention(Option::kAdapt), verb, was, unit, here, unit,
                                  mention(option), was));
  };
  same("min_global_batch", min_global_, Option::kAdaptMinBatch, "kept its global batch at least",
       "");
  same("max_global_batch", max_global_, Option::kAdaptMaxBatch, "kept its global batch at most",
       "");
  micro_cap_ = state.at("micro_batch_cap").get<int64_t>();
  explored_from_ = state.at("explored_from").get<int64_t>();
  speeds_.clear();
  for (const auto& s : state.at("speeds")) {
    speeds_[s.at("global_batch_size").get<int64_t>()] = {s.at("seconds").get<double>(),
                                                         s.at("samples").get<int64_t>()};
  }
  // The profile of the tune the run started from: a resume tunes nothing.
  SpeedProfile profile;
  for (const auto& p : state.value("speed_profile", nlohmann::json::array())) {
    // A state saved before the intervals were kept: the median alone.
    const double median = p.at("samples_per_s").get<double>();
    profile[p.at("global_batch_size").get<int64_t>()] =
        TunedSpeed(median, p.value("low", median), p.value("high", median));
  }
  options_.speed_profile(std::move(profile));
}

}  // namespace batchtune
