#include "run_options.h"

#include <fmt/format.h>

#include <cmath>

#include "batchtune/common/option.h"

namespace batchtune {
namespace {

/// A target accuracy of 2 to 100 was meant as a percent: a target of 1 %
/// (chance on 100 classes) is no target, and just above 1 is a slip.
constexpr double kSmallestPercentTarget = 2;

/// The options every run checks, whatever it trains on (see run_options.h).
void check_run_options(const TrainOptions& options) {
  if (options.epochs() < 0 || options.steps() < 0 ||
      (options.epochs() == 0 && options.steps() == 0)) {
    throw OptionError(Option::kEpochs,
                      fmt::format("need a positive number of epochs or {}, got {} and {}",
                                  mention(Option::kSteps), options.epochs(), options.steps()));
  }
  if (options.log_every() < 0) {
    throw OptionError(Option::kLogEvery,
                      fmt::format("must be 0 (none) or more, got {}", options.log_every()));
  }
  if (options.checkpoint_every() < 0) {
    throw OptionError(Option::kCheckpointEvery,
                      fmt::format("must be 0 (at the end only) or more, got {}",
                                  options.checkpoint_every()));
  }
  if (options.resume() && options.checkpoint_dir().empty()) {
    throw OptionError(Option::kResume,
                      "needs " + mention(Option::kCheckpoint) + " DIR to resume from");
  }
  if (!(std::isfinite(options.time_limit_s()) && options.time_limit_s() >= 0)) {
    throw OptionError(Option::kTimeLimit,
                      fmt::format("must be 0 (no limit) or a number of seconds, got {}",
                                  options.time_limit_s()));
  }
  if (options.adapt() && !options.measure_noise_scale()) {
    throw OptionError(Option::kAdapt, "follows the gradient noise scale, which " +
                                          mention(Option::kNoiseScale) +
                                          " turns off; drop one of them");
  }
  if (const auto& target = options.target_loss()) {
    if (!(std::isfinite(*target) && *target > 0)) {
      throw OptionError(Option::kTargetLoss,
                        fmt::format("must be a positive loss, like 1.5; got {}", *target));
    }
    if (options.target_accuracy()) {
      throw OptionError(Option::kTargetLoss, "a run stops at one target; give it or " +
                                                 mention(Option::kTargetAccuracy) + ", not both");
    }
  }
  if (options.loss_window() < 1) {
    throw OptionError(Option::kTargetLoss,
                      fmt::format("the loss window must be at least 1 step, got {}",
                                  options.loss_window()));
  }
}

}  // namespace

void check_train_options(const TrainOptions& options, bool has_test) {
  check_run_options(options);
  if (options.eval_every_samples() < 0) {
    throw OptionError(Option::kEvalEverySamples,
                      fmt::format("must be 0 (epoch ends only) or more, got {}",
                                  options.eval_every_samples()));
  }
  if (options.eval_every_samples() > 0 && options.eval_every() > 0) {
    throw OptionError(Option::kEvalEverySamples,
                      "give it or " + mention(Option::kEvalEvery) + ", not both");
  }
  if (options.eval_every() < 0) {
    throw OptionError(Option::kEvalEvery, fmt::format("must be 0 (epoch ends only) or more, got {}",
                                                      options.eval_every()));
  }
  if (const auto& target = options.target_accuracy()) {
    check_target_accuracy(*target);
    if (!has_test) {
      throw OptionError(Option::kTargetAccuracy,
                        "needs a test split to evaluate on (" + mention(Option::kData) +
                            " fashion-mnist, or an image folder with a test/ sub-folder)");
    }
  }
}

void check_target_accuracy(double fraction) {
  if (fraction > 0 && fraction <= 1) return;
  // A percent is told its fraction; 1.0000001 is no percent (it was
  // "for 1.0000001 % give 0.010000001000000001").
  const bool percent = fraction >= kSmallestPercentTarget && fraction <= 100;
  throw OptionError(Option::kTargetAccuracy,
                    fmt::format("must be a fraction in (0, 1], like 0.85; got {}{}", fraction,
                                percent ? fmt::format(" (for {:g} % give {:g})", fraction,
                                                      fraction / 100)
                                        : std::string()));
}

}  // namespace batchtune
