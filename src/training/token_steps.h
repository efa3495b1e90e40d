// The step source of a text run (step_source.h), private to the training
// layer: each epoch's micro-batches — length-bucketed and filled to a token
// budget, or fixed batches padded to the longest sequence — grouped into
// optimizer steps by their real tokens.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/data/batch.h"
#include "batchtune/data/text.h"
#include "batchtune/data/token_batches.h"
#include "batchtune/plan/plan.h"
#include "batchtune/training/step_source.h"
#include "batchtune/training/token_trainer.h"

namespace batchtune {

class DeviceMemory;

class TokenSteps final : public StepSource {
 public:
  /// `plan` is the run's as it stands (`--adapt` moves its lr: the source
  /// keeps it in checkpoints); throws `OptionError` for options a text run
  /// does not take and `Error` for a plan whose buckets do not hold the data.
  TokenSteps(const TextDataset& data, Plan& plan, const TokenTrainOptions& options,
             const DeviceMemory& memory);

  std::optional<int64_t> steps_in(int64_t /*epochs*/) const override { return std::nullopt; }
  bool epochs_done(int64_t step, int64_t epochs) const override;
  int64_t epoch_at(int64_t /*step*/) const override { return epoch_done() ? epoch_ + 1 : epoch_; }
  double epochs_at(int64_t step) const override;
  std::string position_in_epoch(int64_t /*step*/) const override;

  void start(int64_t step, const Clock& clock) override;
  void next(int64_t step, bool split_for_noise, double& data_seconds) override;
  int64_t local_samples() const override { return group_samples_; }
  int64_t samples() const override { return group_samples_; }
  at::Tensor backward(TrainingStep& step, int64_t step_index, double& data_seconds) override;
  std::string shrink(const std::string& why, int64_t step_index, TrainingStep& step) override;
  int64_t progress() const override { return tokens_ - start_tokens_; }

  int64_t global_batch() const override { return target_tokens_; }
  BatchChange start_change() const override;
  std::optional<int64_t> micro_cap() const override { return cap_; }
  std::string resize(BatchChange& change, TrainingStep& step) override;

  void identify(RunIdentity& id) const override;
  void save(CheckpointRecord& record) const override;
  void check(const CheckpointRecord& record, const std::string& path) const override;
  void load(const CheckpointRecord& record, const std::vector<BatchChange>& schedule,
            const std::string& path) override;
  void describe(TrainEvent& event, double train_seconds) const override;
  void summarize(TrainSummary& summary, double seconds) const override;

  AdaptOptions adapt_options() const override;

 private:
  /// True when this epoch has no micro-batch left.
  bool epoch_done() const { return next_ >= micro_.size(); }
  /// Starts epoch `epoch`: its micro-batches in their order.
  void start_epoch(int64_t epoch);
  /// The micro-batches of the next optimizer step: until they hold the
  /// target tokens (or, fixed batches without a target, the step's count).
  /// `split_single`: a step of one micro-batch of two samples or more comes
  /// as its two halves (the same samples and tokens), to measure the noise
  /// scale between them.
  std::vector<TokenBatch> next_group(bool split_single);
  /// The data of the step fetched, refilled within the budget as it stands
  /// (smaller after an out-of-memory: `group_` becomes what is trained),
  /// fixed batches padded to their length.
  std::vector<Batch> group_batches();
  /// The budget micro-batches are filled to for `target` real tokens a step.
  int64_t budget_for(int64_t target) const {
    return std::min(cap_, std::max(longest_, target));
  }
  /// Padded tokens of `b` as trained.
  int64_t padded_tokens(const TokenBatch& b) const {
    return fixed_ ? static_cast<int64_t>(b.indices.size()) * pad_to_ : b.padded_tokens;
  }

  const TextDataset& data_;
  const std::vector<int64_t>& lengths_;
  Plan& plan_;
  const Plan start_plan_;
  const TokenTrainOptions& options_;
  const DeviceMemory& memory_;
  const int64_t fixed_batch_size_;
  const bool fixed_;
  const int64_t longest_;
  int64_t pad_to_ = 0;
  /// The most padded tokens a micro-batch may hold (halved by an out-of-memory).
  int64_t cap_ = 0;
  /// The padded tokens micro-batches are filled to.
  int64_t budget_ = 0;
  /// Real tokens an optimizer step gathers (0: `group_size_` micro-batches).
  int64_t target_tokens_ = 0;
  /// Micro-batches a step of fixed batches takes (0: by tokens).
  int64_t group_size_ = 0;
  std::optional<LengthBucketSampler> sampler_;
  // The epoch under way: its micro-batches, the next one's index, the
  // samples trained of it.
  int64_t epoch_ = 0;
  bool started_ = false;
  std::vector<TokenBatch> micro_;
  size_t next_ = 0;
  /// Micro-batches of the epoch before `micro_` (those a resume left behind).
  int64_t epoch_offset_ = 0;
  int64_t epoch_samples_ = 0;
  // The step fetched.
  std::vector<TokenBatch> group_;
  int64_t group_tokens_ = 0;
  int64_t group_samples_ = 0;
  // The run's counts, resumed ones included, and the tokens it resumed at.
  int64_t tokens_ = 0;
  int64_t padded_tokens_ = 0;
  int64_t micro_batches_ = 0;
  int64_t start_tokens_ = 0;
};

}  // namespace batchtune
