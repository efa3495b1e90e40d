#pragma once

// The checks of a run's options, made once before its first step: those
// every run makes, whatever it trains on (`TrainOptions` for images,
// `TokenRunOptions` for text by token budget), and the image trainer's own.

#include <fmt/format.h>

#include <cmath>
#include <cstdint>

#include "batchtune/common/option.h"
#include "batchtune/training/trainer.h"

namespace batchtune {

/// Throws an `OptionError` for the options of `options` that no run takes:
/// no epoch and no step, a negative log or checkpoint interval, a resume
/// without a checkpoint, a negative time limit, `--adapt` with the noise
/// scale off.
template <typename RunOptions>
void check_run_options(const RunOptions& options) {
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
}

/// `check_run_options`, and those only the image trainer takes: the
/// evaluation intervals, the target accuracy (a fraction, and a test split
/// to reach it on, `has_test`).
void check_train_options(const TrainOptions& options, bool has_test);

}  // namespace batchtune
