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

/// How a token-budget run trains.
struct TokenTrainOptions {
  /// Passes over the data (when `steps` is 0).
  TORCH_ARG(int64_t, epochs) = 1;
  /// Optimizer steps in all; 0 for `epochs`.
  TORCH_ARG(int64_t, steps) = 0;
  /// Seeds each epoch's shuffle (with the epoch).
  TORCH_ARG(uint64_t, seed) = 0;
  /// Real tokens per optimizer step, reached by accumulating micro-batches;
  /// 0 for the plan's token budget (about one full micro-batch a step), or
  /// with `fixed_batch_size` for the plan's accumulation steps (micro-batches
  /// a step, however padded). Fewer than the budget make micro-batches of
  /// that many padded tokens (at least the longest sample).
  TORCH_ARG(int64_t, target_tokens) = 0;
  /// A log event every this many optimizer steps; 0 for none.
  TORCH_ARG(int64_t, log_every) = 0;
  /// Fixed batches instead (the baseline): this many samples per
  /// micro-batch, each padded to `pad_to` tokens; 0 for the token budget.
  TORCH_ARG(int64_t, fixed_batch_size) = 0;
  TORCH_ARG(int64_t, pad_to) = 0;
  /// Stop as soon as the mean training loss over the last `loss_window`
  /// optimizer steps is at or below this; nullopt trains the steps or
  /// epochs out.
  TORCH_ARG(std::optional<double>, target_loss) = std::nullopt;
  /// Optimizer steps in the moving mean `target_loss` is checked against: a
  /// few, so that one lucky batch does not end the run.
  TORCH_ARG(int64_t, loss_window) = 10;
  /// Directory of `checkpoint.pt`; empty for no checkpoints. A checkpoint
  /// holds the weights, the optimizer, the rest of the epoch's micro-batches
  /// and the token counts, so that a resume trains the same steps on.
  TORCH_ARG(std::string, checkpoint_dir) = "";
  /// A checkpoint every this many optimizer steps (and always at the end,
  /// or when interrupted); 0 for the end only.
  TORCH_ARG(int64_t, checkpoint_every) = 0;
  /// Continue from the checkpoint in `checkpoint_dir` when there is one.
  TORCH_ARG(bool, resume) = false;
  /// Stop after the step at which this run's training time reaches this
  /// many seconds (0: no limit). A run so stopped is complete, with
  /// `time_limit_reached` set; its checkpoint resumes for more.
  TORCH_ARG(double, time_limit_s) = 0.0;
  /// The clock training time is read from (a fake in tests); null for the
  /// steady clock.
  TORCH_ARG(ClockPointer, clock) = nullptr;
  /// Measure the gradient noise scale, in tokens: the first micro-batch of a
  /// step against the whole step, or, in a step of one micro-batch, one step
  /// in `kNoiseScaleEveryWithoutAccumulation` split in two (with `adapt`:
  /// every such step against the previous one).
  TORCH_ARG(bool, measure_noise_scale) = true;
  /// Adapt the real tokens per step (the global batch, counted in tokens)
  /// and the lr to the noise scale as training goes (see `BatchAdapter`),
  /// from `target_tokens`; the micro-batches follow, up to the plan's
  /// budget. Needs `measure_noise_scale`; not with `fixed_batch_size`.
  TORCH_ARG(bool, adapt) = false;
  /// `max_global_batch` in tokens; 0 for 32x the start, within the data.
  TORCH_ARG(AdaptOptions, adapt_options) = {};
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
/// fields say where). With `checkpoint_dir` it writes checkpoints, and
/// `resume` continues from one; an interrupt (`interrupt_requested()`,
/// polled after each optimizer step) ends the run with a checkpoint and a
/// summary marked incomplete. Throws `batchtune::Error` when a single sample
/// does not fit, or a checkpoint does not match this run.
///
/// Example:
/// ```
///   batchtune::TextDataset text("/usr/share/common-licenses", {16, 512});
///   auto summary = batchtune::train_by_tokens(workload, *memory, plan, text,
///                                             batchtune::TokenTrainOptions().epochs(1));
///   std::cout << summary.tokens_per_s;
/// ```
TrainSummary train_by_tokens(Workload& workload, DeviceMemory& memory, const Plan& plan,
                             const TextDataset& data, const TokenTrainOptions& options,
                             const TrainCallback& callback = {},
                             const std::function<void(int64_t)>& before_step = {});

}  // namespace batchtune
