// The rules of a plan: how a micro-batch reaches a global batch, how the
// learning rate follows it, how long it warms up.
#include "batchtune/plan/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"

namespace batchtune {

namespace {

/// Warm-up steps of the rule at most: a few hundred steps cover the largest
/// scale factors in use (Goyal et al. warmed up a 32x factor over ~780).
constexpr int64_t kMaxRuleWarmupSteps = 500;

std::string format_lr(double lr) { return fmt::format("{:.6g}", lr); }

/// `option` as the plan's reader names it ("--base-batch", "base_batch").
std::string name(const PlanOptions& o, Option option) { return option_name(option, o.front_end()); }

/// Where `option`'s value came from, in words: the caller's source ("the
/// plan p.json"), else the option's name.
std::string source(const PlanOptions& o, Option option) {
  return option_source(option, o.front_end(), o.sources());
}

/// The speed at `batch`, read from measured rows: linear in log(batch)
/// between the two rows around it (a row itself where there is one);
/// nullopt outside the rows.
std::optional<double> speed_at(const std::vector<MeasuredSpeed>& speeds, int64_t batch) {
  std::optional<MeasuredSpeed> below;
  std::optional<MeasuredSpeed> above;
  for (const MeasuredSpeed& s : speeds) {
    if (s.batch_size < 1 || !(s.samples_per_s > 0)) continue;
    if (s.batch_size == batch) return s.samples_per_s;
    if (s.batch_size < batch && (!below || s.batch_size > below->batch_size)) below = s;
    if (s.batch_size > batch && (!above || s.batch_size < above->batch_size)) above = s;
  }
  if (!below || !above) return std::nullopt;
  const double t = std::log(static_cast<double>(batch) / static_cast<double>(below->batch_size)) /
                   std::log(static_cast<double>(above->batch_size) /
                            static_cast<double>(below->batch_size));
  return below->samples_per_s + t * (above->samples_per_s - below->samples_per_s);
}

/// The divisors of `n` (n ≥ 1), largest first.
std::vector<int64_t> divisors_descending(int64_t n) {
  std::vector<int64_t> small;
  std::vector<int64_t> large;
  for (int64_t d = 1; d <= n / d; ++d) {
    if (n % d != 0) continue;
    small.push_back(d);
    if (d != n / d) large.push_back(n / d);
  }
  std::vector<int64_t> all(large.begin(), large.end());
  all.insert(all.end(), small.rbegin(), small.rend());
  return all;
}

/// How a plan reaches its global batch.
struct Split {
  int64_t micro = 1;
  int64_t accumulation = 1;
  std::string micro_reason;   ///< empty when the micro-batch is the one given
  std::string global_reason;
};

/// What a micro-batch of `size` costs against `reference`'s speed, in words.
std::string cost_words(const std::vector<MeasuredSpeed>& speeds, int64_t size, int64_t reference) {
  const auto speed = speed_at(speeds, size);
  const auto reference_speed = speed_at(speeds, reference);
  if (!speed || !reference_speed) return "its speed was not measured";
  const double slower = 100.0 * (1 - *speed / *reference_speed);
  return slower > 0.05 ? fmt::format("the sweep puts it {:.1f} % slower", slower)
                       : std::string("the sweep puts it no slower");
}

/// The micro-batch and accumulation of a plan: the micro-batch given,
/// rounded down to `multiple_of`; with a target, the largest micro-batch up
/// to that one that divides the target's share of a process and costs no
/// more than the tolerance (see `PlanOptions::target_batch`), else the
/// nearest reachable global batch.
Split split_global_batch(const PlanOptions& o) {
  const int64_t chosen = o.micro_batch_size();
  const int64_t multiple = o.multiple_of();
  const int64_t world = o.world_size();
  const std::string processes = world > 1 ? fmt::format(" on each of {} processes", world) : "";
  Split split;
  split.micro = chosen;
  std::string multiple_note;
  if (multiple > 1) {
    if (chosen < multiple) {
      multiple_note = fmt::format("kept, though below {} {}: no multiple of it fits",
                                  source(o, Option::kMultipleOf), multiple);
    } else {
      split.micro = chosen / multiple * multiple;
    }
  }
  const auto aligned = [&](int64_t size) {
    return multiple <= 1 || chosen < multiple || size % multiple == 0;
  };
  const int64_t target = o.target_batch();
  const std::string target_source = source(o, Option::kTargetBatch);
  if (target == 0) {
    split.global_reason = fmt::format(
        "global batch {}: the micro-batch {}{}, no accumulation (no {})", split.micro * world,
        split.micro, world > 1 ? fmt::format(" x {} processes", world) : "",
        target_source);
  } else {
    const int64_t per_process = target / world;
    std::optional<int64_t> exact;
    if (target % world == 0 && per_process >= 1) {
      const int64_t upper = std::min(split.micro, per_process);
      const auto reference_speed = speed_at(o.speeds(), split.micro);
      for (const int64_t size : divisors_descending(per_process)) {
        if (size > upper || !aligned(size)) continue;
        if (upper == per_process && size == upper) {
          exact = size;  // the target's share itself: no accumulation
          break;
        }
        const auto speed = speed_at(o.speeds(), size);
        const bool affordable =
            speed && reference_speed
                ? *speed >= (1 - o.speed_tolerance()) * *reference_speed
                : static_cast<double>(size) >=
                      kUnmeasuredMicroBatchShare * static_cast<double>(split.micro);
        if (affordable) exact = size;
        break;  // smaller divisors cost more still
      }
    }
    if (exact) {
      if (*exact != split.micro) {
        split.micro_reason =
            *exact == per_process && per_process < split.micro
                ? fmt::format("micro-batch {}, not the {} chosen: {} {} needs no more{}", *exact,
                              chosen, target_source, target, processes)
                : fmt::format("micro-batch {}, not the {} chosen: the largest that reaches {} {} "
                              "exactly; {}",
                              *exact, chosen, target_source, target,
                              cost_words(o.speeds(), *exact, chosen));
      }
      split.micro = *exact;
      split.accumulation = per_process / *exact;
      split.global_reason =
          split.accumulation == 1
              ? fmt::format("global batch {}: {} {}, one micro-batch of {}{} per step", target,
                            target_source, target, split.micro, processes)
              : fmt::format("global batch {}: {} {} reached by accumulating {} micro-batches of "
                            "{}{}",
                            target, target_source, target, split.accumulation,
                            split.micro, processes);
    } else {
      if (target < split.micro * world) {
        // Below one micro-batch a process: a smaller micro-batch, not a
        // global batch several times the target.
        split.micro = std::max<int64_t>(
            1, std::llround(static_cast<double>(target) / static_cast<double>(world)));
        // The multiple still holds: the largest one below, or the multiple itself.
        const bool rounded = !aligned(split.micro);
        if (rounded) split.micro = std::max(multiple, split.micro / multiple * multiple);
        split.micro_reason = fmt::format("micro-batch {}, not the {} chosen: {} {}{} needs no more{}",
                                         split.micro, chosen, target_source, target, processes,
                                         rounded ? fmt::format(", kept to a multiple of {} {}",
                                                               source(o, Option::kMultipleOf),
                                                               multiple)
                                                 : std::string());
      }
      const int64_t per_step = split.micro * world;
      split.accumulation = std::max<int64_t>(
          1, static_cast<int64_t>(std::llround(static_cast<double>(target) /
                                               static_cast<double>(per_step))));
      const int64_t reached = per_step * split.accumulation;
      split.global_reason = fmt::format(
          "global batch {}: {} {} cannot be reached exactly ({}); accumulating {} "
          "micro-batches of {}{} gives the nearest, {:+.1f} % off",
          reached, target_source, target,
          target % world != 0
              ? fmt::format("it is not a multiple of the {} processes", world)
              : fmt::format("no micro-batch within the speed tolerance of {} divides {}",
                            split.micro, per_process),
          split.accumulation, split.micro, processes,
          100.0 * static_cast<double>(reached - target) / static_cast<double>(target));
    }
  }
  if (split.micro_reason.empty() && split.micro != chosen) {
    split.micro_reason = fmt::format("micro-batch {}, not the {} chosen: rounded down to a "
                                     "multiple of {} ({}); {}",
                                     split.micro, chosen, multiple, source(o, Option::kMultipleOf),
                                     cost_words(o.speeds(), split.micro, chosen));
  } else if (!multiple_note.empty()) {
    split.micro_reason = fmt::format("micro-batch {}: {}", split.micro, multiple_note);
  }
  return split;
}

}  // namespace

double scale_lr(double base_lr, int64_t base_batch, int64_t global_batch, LrScaling scaling) {
  const double ratio = static_cast<double>(global_batch) / static_cast<double>(base_batch);
  switch (scaling) {
    case LrScaling::kLinear: return base_lr * ratio;
    case LrScaling::kSqrt: return base_lr * std::sqrt(ratio);
    case LrScaling::kNone: return base_lr;
  }
  return base_lr;
}

int64_t warmup_rule(double lr_factor) {
  if (!(lr_factor > 1)) return 0;
  const double steps = std::ceil(static_cast<double>(kWarmupStepsPerLrDoubling) *
                                 std::log2(lr_factor) - 1e-9);
  return std::min<int64_t>(kMaxRuleWarmupSteps, static_cast<int64_t>(steps));
}

double scheduled_lr(double lr, int64_t warmup_steps, int64_t step) {
  if (warmup_steps <= 0 || step >= warmup_steps) return lr;
  return lr * static_cast<double>(std::max<int64_t>(step, 0) + 1) /
         static_cast<double>(warmup_steps);
}

Plan make_plan(const PlanOptions& o) {
  if (o.micro_batch_size() < 1) {
    throw OptionError(Option::kBatchSize,
                      fmt::format("must be at least 1, got {}", o.micro_batch_size()));
  }
  if (o.world_size() < 1) {
    throw OptionError(Option::kWorldSize, fmt::format("must be at least 1, got {}", o.world_size()));
  }
  if (o.target_batch() < 0) {
    throw OptionError(Option::kTargetBatch,
                      fmt::format("must be at least 1, got {}", o.target_batch()));
  }
  if (!(o.base_lr() > 0) || !std::isfinite(o.base_lr())) {
    throw OptionError(Option::kBaseLr, fmt::format("must be positive, got {}", o.base_lr()));
  }
  if (o.base_lr() > kMaxLearningRate) {
    throw OptionError(Option::kBaseLr, fmt::format("must be at most {:g}, got {:g}",
                                                   kMaxLearningRate, o.base_lr()));
  }
  if (o.base_batch() < 0) {
    throw OptionError(Option::kBaseBatch, fmt::format("must be at least 1, got {}", o.base_batch()));
  }
  for (const auto& [option, value] : {std::pair{Option::kBatchSize, o.micro_batch_size()},
                                      std::pair{Option::kWorldSize, o.world_size()},
                                      std::pair{Option::kTargetBatch, o.target_batch()},
                                      std::pair{Option::kBaseBatch, o.base_batch()},
                                      std::pair{Option::kWarmup, o.warmup_steps()}}) {
    if (value > kMaxPlanCount) {
      throw OptionError(option, fmt::format("must be at most {}, got {}", kMaxPlanCount, value));
    }
  }
  if (o.workers() < 0 || o.workers() > kMaxWorkers) {
    throw OptionError(Option::kWorkers, fmt::format("must be 0 (load on the training thread) to "
                                                    "{}, got {}",
                                                    kMaxWorkers, o.workers()));
  }
  if (o.prefetch() < 0 || o.prefetch() > kMaxPrefetch) {
    throw OptionError(Option::kPrefetch, fmt::format("must be 0 to {} batches per worker, got {}",
                                                     kMaxPrefetch, o.prefetch()));
  }
  if (o.amp() == AmpMode::kAuto) {
    throw OptionError(Option::kAmp, "auto must be resolved (choose_amp) before a plan is made");
  }
  if (o.multiple_of() < 1 || o.multiple_of() > kMaxPlanCount) {
    throw OptionError(Option::kMultipleOf, fmt::format("must be from 1 to {}, got {}",
                                                       kMaxPlanCount, o.multiple_of()));
  }
  if (!(o.speed_tolerance() >= 0 && o.speed_tolerance() < 1)) {
    throw OptionError(Option::kTolerance, fmt::format("must be at least 0 and below 1, got {}",
                                                      o.speed_tolerance()));
  }
  Plan plan;
  plan.micro_batch_size = o.micro_batch_size();
  plan.world_size = o.world_size();
  const std::optional<int64_t> per_step_checked =
      checked_product(plan.micro_batch_size, plan.world_size);
  if (!per_step_checked) {
    throw OptionError(Option::kBatchSize,
                      fmt::format("{} x {} processes is more than {} samples per step",
                                  plan.micro_batch_size, plan.world_size, kMaxPlanCount));
  }
  const Split split = split_global_batch(o);
  plan.micro_batch_size = split.micro;
  plan.accumulation_steps = split.accumulation;
  if (!split.micro_reason.empty()) plan.set_reason(PlanField::kMicroBatch, split.micro_reason);
  plan.set_reason(PlanField::kGlobalBatch, split.global_reason);
  const std::optional<int64_t> global = checked_product(
      *checked_product(plan.micro_batch_size, plan.world_size), plan.accumulation_steps);
  if (!global) {
    throw OptionError(Option::kTargetBatch, fmt::format("{} is more than {} samples per step",
                                                        o.target_batch(), kMaxPlanCount));
  }
  plan.global_batch_size = *global;

  const bool base_known = o.base_batch() > 0;
  const int64_t base_batch = base_known ? o.base_batch() : plan.global_batch_size;
  const bool default_scaling = o.lr_scaling().empty();
  plan.lr_scaling = default_scaling ? default_lr_scaling(o.optimizer())
                                    : parse_lr_scaling(o.lr_scaling());
  plan.lr = scale_lr(o.base_lr(), base_batch, plan.global_batch_size, plan.lr_scaling);
  if (!(plan.lr <= kMaxLearningRate)) {
    throw OptionError(Option::kBaseLr,
                      fmt::format("{:g} scaled {} from batch {} to {} gives lr {:g}, above {:g}; "
                                  "give a smaller {} or {}, or {} none",
                                  o.base_lr(), lr_scaling_name(plan.lr_scaling), base_batch,
                                  plan.global_batch_size, plan.lr, kMaxLearningRate,
                                  mention(Option::kBaseLr), mention(Option::kTargetBatch),
                                  mention(Option::kLrScaling)));
  }
  const std::string scaling_why =
      default_scaling
          ? fmt::format(" ({} is the default for {}{})", lr_scaling_name(plan.lr_scaling),
                        o.optimizer(),
                        plan.lr_scaling == LrScaling::kSqrt
                            ? ", whose per-parameter normalisation makes linear scaling too "
                              "aggressive"
                            : "")
          : fmt::format(" (from {})", source(o, Option::kLrScaling));
  if (!base_known) {
    plan.set_reason(PlanField::kLr,
                    fmt::format("lr {}: the base lr ({}), not scaled: the batch it belongs to is "
                                "unknown (give {} to scale it to the global batch {})",
                                format_lr(plan.lr), source(o, Option::kBaseLr),
                                name(o, Option::kBaseBatch),
                                plan.global_batch_size));
  } else if (base_batch == plan.global_batch_size || plan.lr_scaling == LrScaling::kNone) {
    plan.set_reason(PlanField::kLr, fmt::format("lr {}: the base lr, unscaled{}", format_lr(plan.lr),
                                       base_batch == plan.global_batch_size
                                           ? fmt::format(" since the global batch equals the "
                                                         "base batch {}",
                                                         base_batch)
                                           : scaling_why));
  } else {
    plan.set_reason(PlanField::kLr, fmt::format("lr {}: base lr {} ({}) at batch {} scaled {} to batch {}{}",
                                       format_lr(plan.lr), format_lr(o.base_lr()),
                                       source(o, Option::kBaseLr), base_batch,
                                       lr_scaling_name(plan.lr_scaling),
                                       plan.global_batch_size, scaling_why));
  }

  const double factor = plan.lr / o.base_lr();
  if (o.warmup_steps() >= 0) {
    plan.warmup_steps = o.warmup_steps();
    plan.set_reason(PlanField::kWarmup,
        fmt::format("warm-up {} steps: from {}", plan.warmup_steps, source(o, Option::kWarmup)));
  } else {
    plan.warmup_steps = warmup_rule(factor);
    plan.set_reason(PlanField::kWarmup,
        plan.warmup_steps == 0
            ? std::string("no warm-up: the lr is not raised above the base lr")
            : fmt::format("warm-up {} steps: {} per doubling of the lr, which the plan raised "
                          "{:.2f}x",
                          plan.warmup_steps, kWarmupStepsPerLrDoubling, factor));
  }

  plan.amp = o.amp();
  plan.set_reason(PlanField::kAmp, !o.amp_reason().empty() ? o.amp_reason()
                                                           : "amp " + amp_name(plan.amp));
  plan.workers = o.workers();
  plan.pin_memory = o.pin_memory();
  plan.prefetch = o.prefetch();
  // Only the CLI's `tune --data` times worker counts; from Python the
  // batches come from the caller's own loader.
  plan.set_reason(PlanField::kInputPipeline, fmt::format(
      "input pipeline: {} workers, pin_memory {}, prefetch {} ({})", plan.workers,
      plan.pin_memory ? "on" : "off", plan.prefetch,
      o.front_end() == FrontEnd::kCli ? "tune with --data times the worker counts"
                                      : "the defaults, not timed"));
  return plan;
}

}  // namespace batchtune
