// The batch source of a token run (token_run.h), private to the training
// layer: each epoch's micro-batches — length-bucketed and filled to a token
// budget, or fixed batches padded to the longest sequence — grouped into
// optimizer steps by their real tokens.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <vector>

#include "batchtune/data/batch.h"
#include "batchtune/data/text.h"
#include "batchtune/data/token_batches.h"
#include "batchtune/plan/plan.h"
#include "batchtune/training/token_trainer.h"

namespace batchtune {

class TokenSteps {
 public:
  /// `plan` and `options` as `TokenRun` checked them; throws `Error` for a
  /// plan whose buckets do not hold the data.
  TokenSteps(const TextDataset& data, const Plan& plan, const TokenTrainOptions& options);

  /// Starts epoch `epoch`: its micro-batches in their order, or, first after
  /// a resume (`load`), the rest of the epoch it stopped in.
  void start_epoch(int64_t epoch);
  /// True when this epoch has no micro-batch left.
  bool epoch_done() const { return next_ >= micro_.size(); }
  /// The micro-batches of the next optimizer step: until they hold the
  /// target tokens (or, fixed batches without a target, the step's count).
  /// `split_single`: a step of one micro-batch of two samples or more comes
  /// as its two halves (the same samples and tokens), to measure the noise
  /// scale between them.
  std::vector<TokenBatch> next_group(bool split_single);
  /// The data of `group`, refilled within the budget as it stands (smaller
  /// after an out-of-memory: `group` becomes what is trained), fixed
  /// batches padded to their length.
  std::vector<Batch> batches(std::vector<TokenBatch>& group) const;

  /// After an out-of-memory: halves the budget (never below the longest
  /// sample); false when nothing smaller is left (fixed batches, or a
  /// budget of one longest sample).
  bool halve_budget();
  /// `--adapt`: `target` real tokens a step from the next step on; the rest
  /// of the epoch, the same samples in the same order, is cut anew into
  /// micro-batches of the new budget.
  void set_target_tokens(int64_t target);

  /// Checkpoints: the tokens per step, the budget, its cap and the rest of
  /// the epoch, into and from a checkpoint's JSON `tokens` (the keys
  /// `target_tokens`, `token_budget`, `token_cap`, `rest_of_epoch`).
  void save(nlohmann::json& tokens) const;
  void load(const nlohmann::json& tokens);

  bool fixed() const { return fixed_; }
  /// The length fixed batches are padded to (0 for a token budget).
  int64_t pad_to() const { return pad_to_; }
  /// The longest sample the data may hold.
  int64_t longest() const { return longest_; }
  /// The most padded tokens a micro-batch may hold (halved by an out-of-memory).
  int64_t cap() const { return cap_; }
  /// The padded tokens micro-batches are filled to.
  int64_t budget() const { return budget_; }
  /// Real tokens an optimizer step gathers (0: `group_size()` micro-batches).
  int64_t target_tokens() const { return target_tokens_; }
  /// Micro-batches a step of fixed batches takes (0: by tokens).
  int64_t group_size() const { return group_size_; }
  /// Micro-batches of this epoch handed out so far.
  size_t position() const { return next_; }
  /// Padded tokens of `b` as trained.
  int64_t padded_tokens(const TokenBatch& b) const {
    return fixed_ ? static_cast<int64_t>(b.indices.size()) * pad_to_ : b.padded_tokens;
  }

 private:
  /// The budget micro-batches are filled to for `target` real tokens a step.
  int64_t budget_for(int64_t target) const {
    return std::min(cap_, std::max(longest_, target));
  }

  const TextDataset& data_;
  const std::vector<int64_t>& lengths_;
  const uint64_t seed_;
  const int64_t fixed_batch_size_;
  const bool fixed_;
  const int64_t longest_;
  int64_t pad_to_ = 0;
  int64_t cap_ = 0;
  int64_t budget_ = 0;
  int64_t target_tokens_ = 0;
  int64_t group_size_ = 0;
  std::optional<LengthBucketSampler> sampler_;
  std::vector<TokenBatch> micro_;  // this epoch's micro-batches
  size_t next_ = 0;
  /// After a resume: the rest of the epoch it stopped in, to train first.
  std::optional<std::vector<TokenBatch>> resumed_rest_;
};

}  // namespace batchtune
