#pragma once

// The checks of a run's options (`TrainOptions`), made once before its first
// step: those every run makes, whatever it trains on, and those of the
// evaluation only the image trainer runs.

#include "batchtune/training/trainer.h"

namespace batchtune {

/// Throws an `OptionError` for the options of `options` that no run takes:
/// no epoch and no step, a negative log or checkpoint interval, a resume
/// without a checkpoint, a negative time limit, `--adapt` with the noise
/// scale off, a target loss that is no positive loss or comes with a target
/// accuracy, an empty loss window.
void check_run_options(const TrainOptions& options);

/// `check_run_options`, and those only the image trainer takes: the
/// evaluation intervals, the target accuracy (a fraction, and a test split
/// to reach it on, `has_test`).
void check_train_options(const TrainOptions& options, bool has_test);

}  // namespace batchtune
