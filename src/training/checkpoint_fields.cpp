#include "training/checkpoint_fields.h"

#include <fmt/format.h>

#include <cfloat>
#include <cmath>
#include <limits>

#include "batchtune/common/counts.h"
#include "batchtune/common/option.h"
#include "batchtune/plan/plan.h"

namespace batchtune {
namespace {

constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

/// The noise estimate's averages are of float32 squared norms: a magnitude
/// past float's largest never came from a run (a hand-edited -2.4e114 did).
constexpr double kMaxNoiseAverage = FLT_MAX;

}  // namespace

void CheckpointFields::fail(const std::string& field, const std::string& what) const {
  throw OptionError(Option::kResume,
                    fmt::format("{}: field '{}' {}; restore a good copy, or give another {} DIR "
                                "to start afresh",
                                path_, field, what, mention(Option::kCheckpoint)));
}

const nlohmann::json& CheckpointFields::at(const nlohmann::json& json, const char* name,
                                           const std::string& field) const {
  if (!json.is_object()) fail(field, "is in " + std::string(json.type_name()) + ", not an object");
  const auto it = json.find(name);
  if (it == json.end()) fail(field, "is missing");
  return *it;
}

int64_t CheckpointFields::count(const nlohmann::json& json, const char* name,
                                const std::string& field, int64_t min, int64_t max) const {
  return count(at(json, name, field), field, min, max);
}

int64_t CheckpointFields::count(const nlohmann::json& value, const std::string& field,
                                int64_t min, int64_t max) const {
  if (!value.is_number_integer() ||
      (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(kMaxInt64))) {
    fail(field, "must be an integer, got " + value.dump());
  }
  const auto n = value.get<int64_t>();
  if (n < min || n > max) {
    fail(field, fmt::format("must be in [{}, {}], got {}", min, max, n));
  }
  return n;
}

double CheckpointFields::number(const nlohmann::json& json, const char* name,
                                const std::string& field, double min, double max) const {
  const nlohmann::json& value = at(json, name, field);
  if (!value.is_number()) fail(field, "must be a number, got " + value.dump());
  const auto x = value.get<double>();
  if (!std::isfinite(x) || x < min || x > max) {
    // The smallest positive double stands for "above 0".
    const std::string low = min == std::numeric_limits<double>::min()
                                ? std::string("(0")
                                : fmt::format("[{:g}", min);
    fail(field, fmt::format("must be in {}, {:g}], got {}", low, max, value.dump()));
  }
  return x;
}

const nlohmann::json& CheckpointFields::array(const nlohmann::json& json, const char* name,
                                              const std::string& field) const {
  const nlohmann::json& value = at(json, name, field);
  if (!value.is_array()) fail(field, "must be an array, got " + value.dump().substr(0, 40));
  return value;
}

void check_position_fields(const nlohmann::json& position, const std::string& path) {
  const CheckpointFields f(path);
  for (const char* name : {"step", "epoch", "batch_in_epoch", "oom_recoveries"}) {
    f.count(position, name, std::string("position.") + name, 0, kMaxPlanCount);
  }
  f.count(position, "samples", "position.samples", 0, kMaxInt64);
}

void check_batch_schedule_fields(const nlohmann::json& schedule, const std::string& field,
                                 const CheckpointFields& f) {
  if (!schedule.is_array()) f.fail(field, "must be an array");
  for (size_t i = 0; i < schedule.size(); ++i) {
    const nlohmann::json& row = schedule[i];
    const std::string at = fmt::format("{}[{}].", field, i);
    f.count(row, "step", at + "step", 0, kMaxPlanCount);
    f.count(row, "global_batch_size", at + "global_batch_size", 1, kMaxPlanCount);
    f.count(row, "micro_batch_size", at + "micro_batch_size", 1, kMaxPlanCount);
    f.count(row, "accumulation_steps", at + "accumulation_steps", 1, kMaxPlanCount);
    // A learning rate is positive and at most the plan's bound.
    f.number(row, "lr", at + "lr", std::numeric_limits<double>::min(), kMaxLearningRate);
    if (row.contains("noise_scale") && !row.at("noise_scale").is_null()) {
      f.number(row, "noise_scale", at + "noise_scale", -kMaxNoiseAverage, kMaxNoiseAverage);
    }
  }
}

void check_adapt_fields(const nlohmann::json& adapt, const std::string& path) {
  const CheckpointFields f(path);
  check_batch_schedule_fields(f.array(adapt, "batch_schedule", "adapt.batch_schedule"),
                              "adapt.batch_schedule", f);

  const nlohmann::json& policy = adapt.contains("policy") ? adapt.at("policy") : nlohmann::json();
  if (!policy.is_object()) f.fail("adapt.policy", "must be an object");
  f.count(policy, "base_batch", "adapt.policy.base_batch", 1, kMaxPlanCount);
  for (const char* name : {"every", "min_global_batch", "max_global_batch"}) {
    if (policy.contains(name)) {
      f.count(policy, name, std::string("adapt.policy.") + name, 1, kMaxPlanCount);
    }
  }
  // 0: no cap known yet.
  f.count(policy, "micro_batch_cap", "adapt.policy.micro_batch_cap", 0, kMaxPlanCount);
  // 0: no exploration under way.
  f.count(policy, "explored_from", "adapt.policy.explored_from", 0, kMaxPlanCount);
  const nlohmann::json& speeds = f.array(policy, "speeds", "adapt.policy.speeds");
  for (size_t i = 0; i < speeds.size(); ++i) {
    const std::string at = fmt::format("adapt.policy.speeds[{}].", i);
    f.count(speeds[i], "global_batch_size", at + "global_batch_size", 1, kMaxPlanCount);
    f.number(speeds[i], "seconds", at + "seconds", 0, std::numeric_limits<double>::max());
    f.count(speeds[i], "samples", at + "samples", 0, kMaxInt64);
  }
  if (policy.contains("speed_profile")) {
    const nlohmann::json& profile = f.array(policy, "speed_profile", "adapt.policy.speed_profile");
    for (size_t i = 0; i < profile.size(); ++i) {
      const std::string at = fmt::format("adapt.policy.speed_profile[{}].", i);
      f.count(profile[i], "global_batch_size", at + "global_batch_size", 1, kMaxPlanCount);
      for (const char* name : {"samples_per_s", "low", "high"}) {
        if (name == std::string("samples_per_s") || profile[i].contains(name)) {
          f.number(profile[i], name, at + name, 0, std::numeric_limits<double>::max());
        }
      }
    }
  }

  const nlohmann::json& noise = adapt.contains("noise") ? adapt.at("noise") : nlohmann::json();
  if (!noise.is_object()) f.fail("adapt.noise", "must be an object");
  f.number(noise, "ema_gradient_sq", "adapt.noise.ema_gradient_sq", -kMaxNoiseAverage,
           kMaxNoiseAverage);
  f.number(noise, "ema_trace", "adapt.noise.ema_trace", -kMaxNoiseAverage, kMaxNoiseAverage);
  const int64_t measurements =
      f.count(noise, "measurements", "adapt.noise.measurements", 0, kMaxInt64);
  // decay^measurements: 1 before the first, below 1 after (the bias
  // correction divides by 1 - it).
  const double decay_power = f.number(noise, "decay_power", "adapt.noise.decay_power", 0, 1);
  if (measurements > 0 && decay_power >= 1) {
    f.fail("adapt.noise.decay_power",
           fmt::format("must be below 1 after {} measurements, got 1", measurements));
  }
  if (noise.contains("window")) {
    const nlohmann::json& window = f.array(noise, "window", "adapt.noise.window");
    for (size_t i = 0; i < window.size(); ++i) {
      const std::string at = fmt::format("adapt.noise.window[{}]", i);
      const nlohmann::json& pair = window[i];
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number() || !pair[1].is_number() ||
          !(std::abs(pair[0].get<double>()) <= kMaxNoiseAverage) ||
          !(std::abs(pair[1].get<double>()) <= kMaxNoiseAverage)) {
        f.fail(at, "must be two finite numbers, got " + pair.dump().substr(0, 60));
      }
    }
  }

  // -1: no ramp yet; a ramp starts from the lr the run had, positive.
  const int64_t start = f.count(adapt, "lr_ramp_start", "adapt.lr_ramp_start", -1, kMaxPlanCount);
  f.number(adapt, "lr_ramp_from", "adapt.lr_ramp_from",
           start >= 0 ? std::numeric_limits<double>::min() : 0.0, kMaxLearningRate);
}

void check_token_fields(const nlohmann::json& tokens, const std::string& path, int64_t samples,
                        bool fixed_without_target) {
  const CheckpointFields f(path);
  if (tokens.contains("epoch")) f.count(tokens, "epoch", "tokens.epoch", 0, kMaxPlanCount);
  f.number(tokens, "lr", "tokens.lr", std::numeric_limits<double>::min(), kMaxLearningRate);
  const int64_t counted = f.count(tokens, "tokens", "tokens.tokens", 0, kMaxInt64);
  f.count(tokens, "padded_tokens", "tokens.padded_tokens", counted, kMaxInt64);
  f.count(tokens, "micro_batches", "tokens.micro_batches", 0, kMaxInt64);
  f.count(tokens, "epoch_samples", "tokens.epoch_samples", 0, samples);
  if (fixed_without_target) {
    f.count(tokens, "target_tokens", "tokens.target_tokens", 0, 0);
  } else {
    f.count(tokens, "target_tokens", "tokens.target_tokens", 1, kMaxPlanCount);
  }
  f.count(tokens, "token_budget", "tokens.token_budget", 1, kMaxPlanCount);
  f.count(tokens, "token_cap", "tokens.token_cap", 1, kMaxPlanCount);
  const nlohmann::json& rest = f.array(tokens, "rest_of_epoch", "tokens.rest_of_epoch");
  if (static_cast<int64_t>(rest.size()) > samples) {
    f.fail("tokens.rest_of_epoch",
           fmt::format("holds {} micro-batches, more than the {} texts", rest.size(), samples));
  }
  for (size_t i = 0; i < rest.size(); ++i) {
    const std::string at = fmt::format("tokens.rest_of_epoch[{}].", i);
    const nlohmann::json& indices = f.array(rest[i], "indices", at + "indices");
    if (indices.empty()) f.fail(at + "indices", "must name at least one text");
    for (size_t k = 0; k < indices.size(); ++k) {
      f.count(indices[k], fmt::format("{}indices[{}]", at, k), 0, samples - 1);
    }
    const int64_t in = f.count(rest[i], "tokens", at + "tokens", 1, kMaxPlanCount);
    f.count(rest[i], "padded_tokens", at + "padded_tokens", in, kMaxPlanCount);
  }
}

}  // namespace batchtune
