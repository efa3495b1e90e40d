#include "batchtune/plan/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <fstream>
#include <sstream>

#include "batchtune/common/error.h"
#include "batchtune/common/file_roles.h"
#include "common/json_depth.h"

namespace batchtune {
namespace {

/// Warm-up steps of the rule at most: a few hundred steps cover the largest
/// scale factors in use (Goyal et al. warmed up a 32x factor over ~780).
constexpr int64_t kMaxRuleWarmupSteps = 500;

std::string format_lr(double lr) { return fmt::format("{:.6g}", lr); }

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
      multiple_note = fmt::format("kept, though below --multiple-of {}: no multiple of it fits",
                                  multiple);
    } else {
      split.micro = chosen / multiple * multiple;
    }
  }
  const auto aligned = [&](int64_t size) {
    return multiple <= 1 || chosen < multiple || size % multiple == 0;
  };
  const int64_t target = o.target_batch();
  if (target == 0) {
    split.global_reason = fmt::format(
        "global batch {}: the micro-batch {}{}, no accumulation (no {})", split.micro * world,
        split.micro, world > 1 ? fmt::format(" x {} processes", world) : "",
        o.target_batch_source());
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
                              chosen, o.target_batch_source(), target, processes)
                : fmt::format("micro-batch {}, not the {} chosen: the largest that reaches {} {} "
                              "exactly; {}",
                              *exact, chosen, o.target_batch_source(), target,
                              cost_words(o.speeds(), *exact, chosen));
      }
      split.micro = *exact;
      split.accumulation = per_process / *exact;
      split.global_reason =
          split.accumulation == 1
              ? fmt::format("global batch {}: {} {}, one micro-batch of {}{} per step", target,
                            o.target_batch_source(), target, split.micro, processes)
              : fmt::format("global batch {}: {} {} reached by accumulating {} micro-batches of "
                            "{}{}",
                            target, o.target_batch_source(), target, split.accumulation,
                            split.micro, processes);
    } else {
      if (target < split.micro * world) {
        // Below one micro-batch a process: a smaller micro-batch, not a
        // global batch several times the target.
        split.micro = std::max<int64_t>(
            1, std::llround(static_cast<double>(target) / static_cast<double>(world)));
        split.micro_reason = fmt::format("micro-batch {}, not the {} chosen: {} {}{} needs no more",
                                         split.micro, chosen, o.target_batch_source(), target,
                                         processes);
      }
      const int64_t per_step = split.micro * world;
      split.accumulation = std::max<int64_t>(
          1, static_cast<int64_t>(std::llround(static_cast<double>(target) /
                                               static_cast<double>(per_step))));
      const int64_t reached = per_step * split.accumulation;
      split.global_reason = fmt::format(
          "global batch {}: {} {} cannot be reached exactly ({}); accumulating {} "
          "micro-batches of {}{} gives the nearest, {:+.1f} % off",
          reached, o.target_batch_source(), target,
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
                                     "multiple of {} (--multiple-of); {}",
                                     split.micro, chosen, multiple,
                                     cost_words(o.speeds(), split.micro, chosen));
  } else if (!multiple_note.empty()) {
    split.micro_reason = fmt::format("micro-batch {}: {}", split.micro, multiple_note);
  }
  return split;
}

}  // namespace

std::string lr_scaling_name(LrScaling scaling) {
  switch (scaling) {
    case LrScaling::kLinear: return "linear";
    case LrScaling::kSqrt: return "sqrt";
    case LrScaling::kNone: return "none";
  }
  return "none";
}

LrScaling parse_lr_scaling(const std::string& text, const std::string& what) {
  for (LrScaling s : {LrScaling::kLinear, LrScaling::kSqrt, LrScaling::kNone}) {
    if (text == lr_scaling_name(s)) return s;
  }
  throw Error(fmt::format("{}: unknown scaling '{}'; use linear, sqrt or none", what, text));
}

LrScaling default_lr_scaling(const std::string& optimizer) {
  return optimizer == "sgd" ? LrScaling::kLinear : LrScaling::kSqrt;
}

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

void Plan::set_reason(PlanField field, std::string text) {
  for (auto& r : reasons) {
    if (r.field == field && field != PlanField::kNote) {
      r.text = std::move(text);
      return;
    }
  }
  reasons.push_back({field, std::move(text)});
}

std::string Plan::reason(PlanField field) const {
  for (const auto& r : reasons) {
    if (r.field == field) return r.text;
  }
  return {};
}

namespace {

std::vector<std::string> reason_texts(const Plan& plan) {
  std::vector<std::string> texts;
  for (const auto& r : plan.reasons) texts.push_back(r.text);
  return texts;
}

}  // namespace

Plan make_plan(const PlanOptions& o) {
  if (o.micro_batch_size() < 1) {
    throw Error(fmt::format("--batch-size: must be at least 1, got {}", o.micro_batch_size()));
  }
  if (o.world_size() < 1) {
    throw Error(fmt::format("--world-size: must be at least 1, got {}", o.world_size()));
  }
  if (o.target_batch() < 0) {
    throw Error(fmt::format("--target-batch: must be at least 1, got {}", o.target_batch()));
  }
  if (!(o.base_lr() > 0) || !std::isfinite(o.base_lr())) {
    throw Error(fmt::format("--base-lr: must be positive, got {}", o.base_lr()));
  }
  if (o.base_lr() > kMaxLearningRate) {
    throw Error(fmt::format("--base-lr: must be at most {:g}, got {:g}", kMaxLearningRate,
                            o.base_lr()));
  }
  if (o.base_batch() < 0) {
    throw Error(fmt::format("--base-batch: must be at least 1, got {}", o.base_batch()));
  }
  for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"--batch-size", o.micro_batch_size()},
                                    {"--world-size", o.world_size()},
                                    {"--target-batch", o.target_batch()},
                                    {"--base-batch", o.base_batch()},
                                    {"--warmup", o.warmup_steps()}}) {
    if (value > kMaxPlanCount) {
      throw Error(fmt::format("{}: must be at most {}, got {}", flag, kMaxPlanCount, value));
    }
  }
  if (o.workers() > kMaxWorkers) {
    throw Error(fmt::format("--workers: must be at most {}, got {}", kMaxWorkers, o.workers()));
  }
  if (o.prefetch() > kMaxPrefetch) {
    throw Error(fmt::format("--prefetch: must be at most {} batches per worker, got {}",
                            kMaxPrefetch, o.prefetch()));
  }
  if (o.amp() == AmpMode::kAuto) {
    throw Error("--amp: auto must be resolved (choose_amp) before a plan is made");
  }
  if (o.workers() < 0 || o.prefetch() < 0) {
    throw Error("--workers/--prefetch: must not be negative");
  }
  if (o.multiple_of() < 1 || o.multiple_of() > kMaxPlanCount) {
    throw Error(fmt::format("--multiple-of: must be from 1 to {}, got {}", kMaxPlanCount,
                            o.multiple_of()));
  }
  if (!(o.speed_tolerance() >= 0 && o.speed_tolerance() < 1)) {
    throw Error(fmt::format("--tolerance: must be at least 0 and below 1, got {}",
                            o.speed_tolerance()));
  }
  Plan plan;
  plan.micro_batch_size = o.micro_batch_size();
  plan.world_size = o.world_size();
  const std::optional<int64_t> per_step_checked =
      checked_product(plan.micro_batch_size, plan.world_size);
  if (!per_step_checked) {
    throw Error(fmt::format("--batch-size: {} x {} processes is more than {} samples per step",
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
    throw Error(fmt::format("--target-batch: {} is more than {} samples per step",
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
    throw Error(fmt::format("--base-lr: {:g} scaled {} from batch {} to {} gives lr {:g}, above "
                            "{:g}; give a smaller --base-lr or --target-batch, or "
                            "--lr-scaling none",
                            o.base_lr(), lr_scaling_name(plan.lr_scaling), base_batch,
                            plan.global_batch_size, plan.lr, kMaxLearningRate));
  }
  const std::string scaling_why =
      default_scaling
          ? fmt::format(" ({} is the default for {}{})", lr_scaling_name(plan.lr_scaling),
                        o.optimizer(),
                        plan.lr_scaling == LrScaling::kSqrt
                            ? ", whose per-parameter normalisation makes linear scaling too "
                              "aggressive"
                            : "")
          : fmt::format(" (from {})", o.lr_scaling_source());
  if (!base_known) {
    plan.set_reason(PlanField::kLr,
                    fmt::format("lr {}: the base lr ({}), not scaled: the batch it belongs to is "
                                "unknown (give {} to scale it to the global batch {})",
                                format_lr(plan.lr), o.base_lr_source(), o.base_batch_flag(),
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
                                       o.base_lr_source(), base_batch,
                                       lr_scaling_name(plan.lr_scaling),
                                       plan.global_batch_size, scaling_why));
  }

  const double factor = plan.lr / o.base_lr();
  if (o.warmup_steps() >= 0) {
    plan.warmup_steps = o.warmup_steps();
    plan.set_reason(PlanField::kWarmup,
        fmt::format("warm-up {} steps: from {}", plan.warmup_steps, o.warmup_source()));
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
  plan.set_reason(PlanField::kInputPipeline, fmt::format(
      "input pipeline: {} workers, pin_memory {}, prefetch {} (tune with --data times "
      "the worker counts)",
      plan.workers, plan.pin_memory ? "on" : "off", plan.prefetch));
  return plan;
}

nlohmann::json to_json(const Plan& plan) {
  nlohmann::json json = {
      {"micro_batch_size", plan.micro_batch_size},
      {"accumulation_steps", plan.accumulation_steps},
      {"world_size", plan.world_size},
      {"global_batch_size", plan.global_batch_size},
      {"lr", plan.lr},
      {"lr_scaling", lr_scaling_name(plan.lr_scaling)},
      {"warmup_steps", plan.warmup_steps},
      {"amp", amp_name(plan.amp)},
      {"workers", plan.workers},
      {"pin_memory", plan.pin_memory},
      {"prefetch", plan.prefetch},
      {"eval_micro_batch_size", plan.eval_micro_batch_size},
      {"reasons", reason_texts(plan)},
      {"warnings", plan.warnings},
      {"workload", to_json(plan.workload)},
  };
  if (plan.token_budget > 0) {
    json["token_budget"] = plan.token_budget;
    nlohmann::json buckets = nlohmann::json::array();
    for (const auto& b : plan.length_buckets) {
      buckets.push_back({{"max_length", b.max_length}, {"micro_batch_size", b.micro_batch_size}});
    }
    json["length_buckets"] = std::move(buckets);
  }
  return json;
}

nlohmann::json to_json(const PlanWorkload& w) {
  return {
      {"model", w.model},
      {"input", w.input},
      {"optimizer", w.optimizer},
      {"base_lr", w.base_lr},
      {"base_batch", w.base_batch},
      {"device", w.device},
      {"memory_limit_bytes", w.memory_limit_bytes},
  };
}

void check_plan_workload(const PlanWorkload& planned, const PlanWorkload& current,
                         const std::string& source) {
  const auto differ = [&](const char* field, const std::string& a, const std::string& b,
                          const char* fix) {
    if (a.empty() || b.empty() || a == b) return;
    throw Error(fmt::format("{}: the plan was made for {} {}, this run has {}; {}", source,
                            field, a, b, fix));
  };
  differ("model", planned.model, current.model,
         "use that --model, or make a plan for this one (batchtune tune)");
  differ("input", planned.input, current.input,
         "use the same --input, or make a plan for this input (batchtune tune)");
  differ("optimizer", planned.optimizer, current.optimizer,
         "use that --optimizer, or make a plan for this one (batchtune tune)");
  differ("device", planned.device, current.device,
         "train on that --device, or make a plan on this one (batchtune tune)");
  // A smaller budget than the plan was measured under: its micro-batch may
  // not fit. Within `kPlanMemoryTolerance` it is the same budget (without
  // --memory-limit a CPU's budget is the available RAM, which moves).
  if (planned.memory_limit_bytes > 0 && current.memory_limit_bytes > 0 &&
      static_cast<double>(current.memory_limit_bytes) <
          static_cast<double>(planned.memory_limit_bytes) * (1 - kPlanMemoryTolerance)) {
    throw Error(fmt::format("{}: the plan was measured with {} bytes usable, this run has only {}; "
                            "give the same --memory-limit and --margin, or make a plan for this "
                            "budget (batchtune tune)",
                            source, planned.memory_limit_bytes, current.memory_limit_bytes));
  }
}

namespace {

class PlanReader {
 public:
  PlanReader(const nlohmann::json& json, std::string source)
      : json_(json), source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw Error(fmt::format("{}: field '{}': {}", source_, field, what));
  }

  const nlohmann::json& field(const std::string& name) const {
    const auto it = json_.find(name);
    if (it == json_.end()) fail(name, "missing");
    return *it;
  }

  int64_t integer(const std::string& name, int64_t min, int64_t max = kMaxPlanCount) const {
    const auto& value = field(name);
    if (!value.is_number_integer()) fail(name, "must be an integer, got " + value.dump());
    // Unsigned values past int64 would wrap in get<int64_t>().
    if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(max)) {
      fail(name, fmt::format("must be at most {}, got {}", max, value.dump()));
    }
    const auto n = value.get<int64_t>();
    if (n < min) fail(name, fmt::format("must be at least {}, got {}", min, n));
    if (n > max) fail(name, fmt::format("must be at most {}, got {}", max, n));
    return n;
  }

  /// Refuses a field not among `known` (a misspelt field would otherwise
  /// be ignored, and its default used without a word).
  void only(std::initializer_list<const char*> known) const {
    for (const auto& [name, value] : json_.items()) {
      if (std::find_if(known.begin(), known.end(), [&](const char* k) { return name == k; }) ==
          known.end()) {
        fail(name, fmt::format("unknown; a plan's fields here are {}", fmt::join(known, ", ")));
      }
    }
  }

  std::string text(const std::string& name) const {
    const auto& value = field(name);
    if (!value.is_string()) fail(name, "must be a string, got " + value.dump());
    return value.get<std::string>();
  }

 private:
  const nlohmann::json& json_;
  std::string source_;
};

}  // namespace

Plan plan_from_json(const nlohmann::json& input, const std::string& source) {
  if (!input.is_object()) throw Error(source + ": a plan must be a JSON object");
  const nlohmann::json& json =
      input.contains("plan") && input["plan"].is_object() ? input["plan"] : input;
  const PlanReader r(json, source);
  r.only({"micro_batch_size", "accumulation_steps", "world_size", "global_batch_size", "lr",
          "lr_scaling", "warmup_steps", "amp", "workers", "pin_memory", "prefetch",
          "eval_micro_batch_size", "reasons", "warnings", "workload", "token_budget",
          "length_buckets"});
  Plan plan;
  plan.micro_batch_size = r.integer("micro_batch_size", 1);
  plan.accumulation_steps = r.integer("accumulation_steps", 1);
  plan.world_size = r.integer("world_size", 1);
  plan.global_batch_size = r.integer("global_batch_size", 1);
  const auto per_step = checked_product(plan.micro_batch_size, plan.world_size);
  const auto product = per_step ? checked_product(*per_step, plan.accumulation_steps)
                                : std::nullopt;
  if (!product) {
    r.fail("global_batch_size",
           fmt::format("micro_batch_size x accumulation_steps x world_size = {} x {} x {} is "
                       "more than {}",
                       plan.micro_batch_size, plan.accumulation_steps, plan.world_size,
                       kMaxPlanCount));
  }
  if (plan.global_batch_size != *product) {
    r.fail("global_batch_size",
           fmt::format("must be micro_batch_size x accumulation_steps x world_size = {}, got {}",
                       *product, plan.global_batch_size));
  }
  const auto& lr = r.field("lr");
  if (!lr.is_number() || !(lr.get<double>() > 0) || !std::isfinite(lr.get<double>())) {
    r.fail("lr", "must be a positive number, got " + lr.dump());
  }
  if (lr.get<double>() > kMaxLearningRate) {
    r.fail("lr", fmt::format("must be at most {:g}, got {}", kMaxLearningRate, lr.dump()));
  }
  plan.lr = lr.get<double>();
  try {
    plan.lr_scaling = parse_lr_scaling(r.text("lr_scaling"), "x");
  } catch (const Error&) {
    r.fail("lr_scaling", "must be linear, sqrt or none, got " + r.field("lr_scaling").dump());
  }
  plan.warmup_steps = r.integer("warmup_steps", 0);
  const std::string amp = r.text("amp");
  if (amp != "off" && amp != "bf16" && amp != "fp16") {
    r.fail("amp", "must be off, bf16 or fp16, got \"" + amp + "\"");
  }
  plan.amp = parse_amp(amp);
  plan.workers = r.integer("workers", 0, kMaxWorkers);
  const auto& pin = r.field("pin_memory");
  if (!pin.is_boolean()) r.fail("pin_memory", "must be true or false, got " + pin.dump());
  plan.pin_memory = pin.get<bool>();
  plan.prefetch = r.integer("prefetch", 0, kMaxPrefetch);
  if (json.contains("eval_micro_batch_size")) {
    plan.eval_micro_batch_size = r.integer("eval_micro_batch_size", 0);
  }
  if (json.contains("warnings")) {
    const auto& warnings = json["warnings"];
    if (!warnings.is_array()) r.fail("warnings", "must be a list of strings");
    for (const auto& warning : warnings) {
      if (!warning.is_string()) r.fail("warnings", "must be a list of strings");
      plan.warnings.push_back(warning.get<std::string>());
    }
  }
  if (json.contains("workload")) {
    const auto& w = json["workload"];
    if (!w.is_object()) r.fail("workload", "must be an object, got " + w.dump());
    const PlanReader wr(w, source + ": field 'workload'");
    wr.only({"model", "input", "optimizer", "base_lr", "base_batch", "device",
             "memory_limit_bytes"});
    const auto text = [&](const char* name) {
      return w.contains(name) ? wr.text(name) : std::string();
    };
    plan.workload.model = text("model");
    plan.workload.input = text("input");
    plan.workload.optimizer = text("optimizer");
    plan.workload.device = text("device");
    if (w.contains("base_batch")) plan.workload.base_batch = wr.integer("base_batch", 0);
    if (w.contains("memory_limit_bytes")) {
      plan.workload.memory_limit_bytes =
          wr.integer("memory_limit_bytes", 0, std::numeric_limits<int64_t>::max());
    }
    if (w.contains("base_lr")) {
      const auto& v = w["base_lr"];
      if (!v.is_number() || !(v.get<double>() >= 0) || !std::isfinite(v.get<double>())) {
        wr.fail("base_lr", "must be a number, 0 or more, got " + v.dump());
      }
      plan.workload.base_lr = v.get<double>();
    }
  }
  if (json.contains("token_budget") != json.contains("length_buckets")) {
    r.fail(json.contains("token_budget") ? "length_buckets" : "token_budget",
           "missing; token_budget and length_buckets come together");
  }
  if (json.contains("token_budget")) {
    plan.token_budget = r.integer("token_budget", 1);
    const auto& buckets = json["length_buckets"];
    if (!buckets.is_array()) {
      r.fail("length_buckets", "must be a list of {\"max_length\", \"micro_batch_size\"}, got " +
                                   buckets.dump());
    }
    for (size_t i = 0; i < buckets.size(); ++i) {
      const auto& b = buckets[i];
      if (!b.is_object()) {
        r.fail("length_buckets", fmt::format("bucket {}: must be an object, got {}", i, b.dump()));
      }
      const PlanReader br(b, fmt::format("{}: field 'length_buckets' bucket {}", source, i));
      br.only({"max_length", "micro_batch_size"});
      plan.length_buckets.push_back(
          {br.integer("max_length", 1), br.integer("micro_batch_size", 1)});
    }
    check_length_buckets(plan.token_budget, plan.length_buckets, source);
  }
  if (json.contains("reasons")) {
    const auto& reasons = json["reasons"];
    if (!reasons.is_array()) r.fail("reasons", "must be a list of strings");
    for (const auto& reason : reasons) {
      if (!reason.is_string()) r.fail("reasons", "must be a list of strings");
      plan.reasons.push_back({PlanField::kNote, reason.get<std::string>()});
    }
  }
  return plan;
}

Plan parse_plan_json(const std::string& text, const std::string& source) {
  check_json_depth(text, source);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // syntax, and numbers out of range
    std::string what = e.what();
    throw Error(fmt::format("{}: not valid JSON ({})", source, what.substr(what.find(']') + 2)));
  }
  return plan_from_json(json, source);
}

Plan read_plan_file(const std::string& path) {
  check_input_file(path, "--plan");
  std::ifstream in(path);
  if (!in) throw Error(fmt::format("--plan {}: cannot open the file", path));
  std::stringstream text;
  text << in.rdbuf();
  return parse_plan_json(text.str(), "--plan " + path);
}

}  // namespace batchtune
