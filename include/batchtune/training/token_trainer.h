#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "batchtune/data/text.h"
#include "batchtune/data/token_batches.h"
#include "batchtune/plan/plan.h"
#include "batchtune/training/trainer.h"

namespace batchtune {

class DeviceMemory;
class Workload;

/// How a text run trains: the run's options as an image run takes them,
/// and how its micro-batches are made and grouped into optimizer steps.
struct TokenTrainOptions {
  /// Epochs or steps, seed, logs, checkpoints and resume, the time limit,
  /// `target_loss` and its window, the clock, the noise scale and `adapt`
  /// (its `max_global_batch` in tokens; 0 for 32x the start, within the
  /// data), as `Trainer` takes them. Text has no test split: the evaluation
  /// options and `target_accuracy` are refused; a text run reports no
  /// progress events.
  TORCH_ARG(TrainOptions, run) = {};
  /// Real tokens per optimizer step, reached by accumulating micro-batches;
  /// 0 for the plan's token budget (about one full micro-batch a step), or
  /// with `fixed_batch_size` for the plan's accumulation steps (micro-batches
  /// a step, however padded). Fewer than the budget make micro-batches of
  /// that many padded tokens (at least the longest sample). With `run.adapt`
  /// the real tokens per step (the global batch, counted in tokens) and the
  /// lr follow the noise scale from here (see `BatchAdapter`), the
  /// micro-batches up to the plan's budget; not with `fixed_batch_size`.
  TORCH_ARG(int64_t, target_tokens) = 0;
  /// Fixed batches instead (the baseline): this many samples per
  /// micro-batch, each padded to `pad_to` tokens; 0 for the token budget.
  TORCH_ARG(int64_t, fixed_batch_size) = 0;
  TORCH_ARG(int64_t, pad_to) = 0;
};

/// Trains a sequence model by a token budget: each epoch the
/// `LengthBucketSampler` fills micro-batches up to `plan.token_budget`
/// padded tokens within its length buckets; consecutive micro-batches are
/// accumulated until they hold `target_tokens` real tokens, then one
/// optimizer step (lr per `plan.lr`, `plan.warmup_steps`). The loss is
/// normalised per token: each micro-batch's mean over its real tokens
/// (padding is `kIgnoreTarget`) weighted by its share of the step's real
/// tokens. On an out-of-memory the budget is halved and the micro-batches
/// of the step split in two, so the same samples and tokens make the same
/// step; later micro-batches follow the smaller budget. With `target_loss`
/// it stops once the moving mean loss reaches it (the summary's target
/// fields say where). With `checkpoint_dir` it writes checkpoints (the
/// weights, the optimizer, the rest of the epoch's micro-batches and the
/// token counts), and `resume` continues from one; an interrupt (`interrupt_requested()`,
/// polled after each optimizer step) ends the run with a checkpoint and a
/// summary marked incomplete. Throws `batchtune::Error` when a single sample
/// does not fit, or a checkpoint does not match this run.
///
/// Example:
/// ```
///   batchtune::TextDataset text("/usr/share/common-licenses", {16, 512});
///   auto options = batchtune::TokenTrainOptions().run(batchtune::TrainOptions().epochs(1));
///   auto summary = batchtune::train_by_tokens(workload, *memory, plan, text, options);
///   std::cout << summary.tokens_per_s;
/// ```
TrainSummary train_by_tokens(Workload& workload, DeviceMemory& memory, const Plan& plan,
                             const TextDataset& data, const TokenTrainOptions& options,
                             const TrainCallback& callback = {},
                             const std::function<void(int64_t)>& before_step = {});

}  // namespace batchtune
