#pragma once

// A finished run's summary as JSON, both ways: the one writer behind
// `batchtune train --json` (reports/train_reporter.h) and a checkpoint's
// stored summary (checkpoint.h), and its reader.

#include <nlohmann/json.hpp>

#include "batchtune/training/trainer.h"

namespace batchtune {

/// JSON of `batchtune train --json`, field names stable: `steps`, `samples`,
/// `epochs`, `final_loss`, `test_accuracy` (null without a test split),
/// `oom_recoveries`, `skipped_steps`, `loss_scale` (null without fp16),
/// `micro_batch_size`, `accumulation_steps`, `global_batch_size`,
/// `world_size`, `seconds`, `samples_per_s`, `tokens_per_s` (null without
/// tokens), `noise_scale`, `complete`, `interrupted_by` (null when
/// complete), `data_wait_fraction`; `target` (`{metric, value, reached}`,
/// null without one) and `steps_to_target`, `seconds_to_target`,
/// `samples_to_target` (null unless the target was reached), `divergence`
/// (`{step, kind, note}`, kind `not_finite` or `flat`; null when the loss
/// looked like training, see `LossWatch`). Only where
/// they apply: `tokens` (a run with tokens), the token-budget fields
/// (`padded_tokens`, `padding_share`, `token_budget`, `target_tokens`,
/// `micro_batches` and their per-step shares), `batch_schedule` (`--adapt`),
/// `resumed_from_step` (a resumed run), `time_limit_reached`,
/// `already_finished` (a finished run's summary re-emitted).
///
/// Example:
/// ```
///   std::cout << batchtune::to_json(trainer.run()).dump(2);
/// ```
nlohmann::json to_json(const TrainSummary& summary);

/// The summary `to_json` wrote (or a checkpoint of an earlier batchtune:
/// `target_reached` beside `target`, `interrupted_by` a string); the
/// per-step shares and `padding_share` are derived, not read.
/// Throws `nlohmann::json::exception` for a missing or mistyped field.
TrainSummary summary_from_json(const nlohmann::json& j);

}  // namespace batchtune
