// The run behind `train_by_tokens` (see token_trainer.h), private to the
// training layer: token_trainer.cpp trains, token_run_events.cpp reports,
// token_run_checkpoint.cpp writes and reads its checkpoints; what each step
// trains on comes from its batch source, token_steps.h.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/common/clock.h"
#include "batchtune/data/token_batches.h"
#include "batchtune/distributed/data_parallel.h"
#include "batchtune/training/batch_adapter.h"
#include "batchtune/training/loss_target.h"
#include "batchtune/training/token_trainer.h"
#include "token_steps.h"

namespace batchtune {

struct AdaptCheckpoint;
struct RunIdentity;

/// One token-budget run: the epochs' micro-batches grouped into optimizer
/// steps by their real tokens, trained with out-of-memory recovery, and
/// (`--adapt`) the tokens per step moved by goodput.
class TokenRun {
 public:
  TokenRun(Workload& workload, DeviceMemory& memory, const Plan& plan, const TextDataset& data,
           const TokenTrainOptions& options, const TrainCallback& callback,
           const std::function<void(int64_t)>& before_step);
  TrainSummary run();

 private:
  /// The micro-batches of the next optimizer step, from the batch source.
  std::vector<TokenBatch> next_group();
  /// Trains `group` (retried in smaller micro-batches on an out-of-memory);
  /// returns its loss.
  at::Tensor train_group(std::vector<TokenBatch>& group, int64_t group_tokens);
  /// After an out-of-memory (`why`, the error's first line): half the
  /// budget, or an error when a single sample did not fit.
  void shrink_budget(const std::string& why, int64_t group_tokens);
  /// `--adapt`: times the window since the last decision and decides.
  void adapt();
  /// A log event after the step that trained `group`.
  void log(double loss_mean, double lr, const std::vector<TokenBatch>& group);
  /// `target_loss`: adds the step's `loss`; true when the moving mean
  /// reached the target (the summary says where).
  bool reached_target(double loss);
  /// What a checkpoint must match to be resumed.
  RunIdentity run_identity() const;
  /// `--adapt`'s state, as checkpoints keep it (adapt_checkpoint.h).
  AdaptCheckpoint adapt_checkpoint();
  /// Writes the checkpoint; `summary` when the run is finished.
  void save_checkpoint(const std::optional<TrainSummary>& summary = std::nullopt);
  /// `resume`: continues from the checkpoint when there is one (the rest of
  /// its epoch in the batch source); returns the summary of a run that was
  /// already finished.
  std::optional<TrainSummary> resume();
  /// The summary at the end of this run (`interrupted_by` empty: complete).
  TrainSummary finish(const std::string& interrupted_by);
  void emit(TrainEvent event) const {
    if (callback_) callback_(event);
  }

  Workload& workload_;
  DeviceMemory& memory_;
  const Plan& plan_;
  const TokenTrainOptions& options_;
  const TrainOptions& run_;  // options_.run(): epochs, logs, checkpoints...
  const TrainCallback& callback_;
  const std::function<void(int64_t)>& before_step_;
  const Clock& clock_;
  const bool fixed_;
  const std::vector<int64_t>& lengths_;
  /// What each step trains on (set once the options are checked).
  std::optional<TokenSteps> source_;
  TrainingStep step_;
  DataParallel data_parallel_;  // one process: a token run is not data parallel (yet)
  TrainSummary summary_;
  int64_t epoch_ = 0;
  int64_t epoch_samples_ = 0;
  double start_s_ = 0;
  /// A resume: the epoch it stopped in continues (its samples counted so
  /// far kept); and the counts it started this run from (rates are this run's).
  bool resumed_ = false;
  int64_t start_samples_ = 0;
  int64_t start_tokens_ = 0;
  double loss_since_log_ = 0;
  int64_t steps_since_log_ = 0;
  std::optional<LossTarget> loss_target_;  // `target_loss`: the last steps' mean
  // --adapt: the policy (which times its windows), the lr and its ramp.
  std::optional<BatchAdapter> adapter_;
  double lr_ = 0;
  LrRamp ramp_;
};

}  // namespace batchtune
