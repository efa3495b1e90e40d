#include "batchtune/training/loss_watch.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "batchtune/common/option.h"

namespace batchtune {
namespace {

std::string flag(Option option) { return option_name(option, FrontEnd::kCli); }

}  // namespace

const char* divergence_kind_name(Divergence::Kind kind) {
  return kind == Divergence::Kind::kFlat ? "flat" : "not_finite";
}

Divergence::Kind parse_divergence_kind(const std::string& name) {
  if (name == "flat") return Divergence::Kind::kFlat;
  if (name == "not_finite") return Divergence::Kind::kNotFinite;
  throw std::invalid_argument("divergence kind '" + name + "' is neither not_finite nor flat");
}

LossWatch::LossWatch(const Plan& plan, bool adapting, bool from_start)
    : plan_(plan),
      adapting_(adapting),
      // At least half the window at the full lr: a long warm-up is no flat loss.
      flat_window_(std::max(kFlatWindowSteps, 2 * plan.warmup_steps)),
      judge_flat_(from_start) {}

std::string LossWatch::cause() const {
  const PlanWorkload& w = plan_.workload;
  std::string text = fmt::format("lr {:.4g}", plan_.lr);
  if (w.base_lr > 0 && w.base_batch > 0 && w.base_batch != plan_.global_batch_size &&
      plan_.lr_scaling != LrScaling::kNone) {
    text += fmt::format(" ({} {:.4g} at batch {} scaled {} to batch {})", flag(Option::kBaseLr),
                        w.base_lr, w.base_batch, lr_scaling_name(plan_.lr_scaling),
                        plan_.global_batch_size);
  }
  if (plan_.warmup_steps > 0) text += fmt::format(" after {} warm-up steps", plan_.warmup_steps);
  return text;
}

std::optional<Divergence> LossWatch::observe(int64_t step, double loss_sum, int64_t steps) {
  if (steps < 1 || !finite_) return std::nullopt;
  if (!std::isfinite(loss_sum)) {
    finite_ = false;
    divergence_ = Divergence{
        Divergence::Kind::kNotFinite, step,
        fmt::format("the loss is not finite ({}) by step {}: the {} is likely too high; lower {} "
                    "(or {}){}{}",
                    std::isnan(loss_sum) ? "nan" : "inf", step, cause(), flag(Option::kLr), flag(Option::kBaseLr),
                    plan_.warmup_steps > 0
                        ? fmt::format(" or lengthen {} ({} now)", flag(Option::kWarmup),
                                      plan_.warmup_steps)
                        : fmt::format(" or warm it up ({})", flag(Option::kWarmup)),
                    adapting_ ? fmt::format("; {} decides no more changes of the batch",
                                            flag(Option::kAdapt))
                              : std::string())};
    return divergence_;
  }
  if (!judge_flat_) return std::nullopt;
  if (start_steps_ < kLossSmoothSteps) {
    start_sum_ += loss_sum;
    start_steps_ += steps;
  }
  recent_.emplace_back(loss_sum, steps);
  recent_steps_ += steps;
  while (recent_steps_ - recent_.front().second >= kLossSmoothSteps) {
    recent_steps_ -= recent_.front().second;
    recent_.pop_front();
  }
  return judge_flat(step);
}

std::optional<Divergence> LossWatch::judge_flat(int64_t step) {
  if (step < flat_window_) return std::nullopt;
  judge_flat_ = false;  // judged once: a plateau later on is no fault of the lr
  const double start = start_sum_ / static_cast<double>(start_steps_);
  double sum = 0;
  for (const auto& [loss, steps] : recent_) sum += loss;
  const double now = sum / static_cast<double>(recent_steps_);
  if (now < start * (1 - kFlatFall)) return std::nullopt;
  const std::string seen =
      fmt::format("the loss has not fallen in {} steps ({:.4f} over the last {}, {:.4f} over the "
                  "first {})",
                  step, now, recent_steps_, start, start_steps_);
  divergence_ = Divergence{
      Divergence::Kind::kFlat, step,
      plan_.lr > 0
          ? fmt::format("{}: the {} is likely too high (a net stuck where it started) or too "
                        "low; try half the {} (or {})",
                        seen, cause(), flag(Option::kLr), flag(Option::kBaseLr))
          : fmt::format("{}: the lr is 0, which trains nothing; give a positive {}", seen,
                        flag(Option::kLr))};
  return divergence_;
}

}  // namespace batchtune
