#pragma once

// The checks of a run's options (`TrainOptions`), made once before its first
// step, by the one training loop for every run: those whatever it trains
// on, and those of the evaluation, which a run without a test split refuses.

#include "batchtune/training/trainer.h"

namespace batchtune {

/// Throws an `OptionError` for the options of `options` that no run takes:
/// no epoch and no step, a negative log or checkpoint interval, a resume
/// without a checkpoint, a negative time limit, `--adapt` with the noise
/// scale off, a target loss that is no positive loss or comes with a target
/// accuracy, an empty loss window; and for the evaluation's: a negative
/// interval, both intervals, a target accuracy that is no fraction or has no
/// test split to be reached on (`has_test`; text has none).
void check_train_options(const TrainOptions& options, bool has_test);

}  // namespace batchtune
