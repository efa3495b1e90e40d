#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "batchtune/data/length_bucket.h"

namespace batchtune {

/// One micro-batch of a token-budget epoch: the samples, and its tokens
/// (real, and padded: samples × the longest of them).
struct TokenBatch {
  std::vector<int64_t> indices;
  int64_t tokens = 0;
  int64_t padded_tokens = 0;
};

/// Length-bucketed batching by a token budget (as OpenNMT and lhotse do):
/// each epoch the samples are shuffled (seeded by `seed` and the epoch),
/// each goes to the bucket of the smallest bound at least its length, and a
/// bucket's micro-batch is filled while its padded tokens (samples × the
/// longest of them, never more than the bucket's bound) stay within the
/// budget; then it is closed and a new one begun. Every sample lands in
/// exactly one micro-batch per epoch; no micro-batch passes the budget.
///
/// Example:
/// ```
///   batchtune::LengthBucketSampler sampler(text.lengths(), plan.length_buckets,
///                                          plan.token_budget, 0);
///   for (const auto& micro : sampler.epoch(0)) { /* text.get_batch(micro.indices) */ }
/// ```
class LengthBucketSampler {
 public:
  /// Throws `batchtune::Error` for a sample longer than the largest bucket,
  /// or a budget smaller than the longest sample.
  LengthBucketSampler(std::vector<int64_t> lengths, std::vector<LengthBucket> buckets,
                      int64_t token_budget, uint64_t seed);
  /// The micro-batches of epoch `epoch`, in the order they closed.
  std::vector<TokenBatch> epoch(int64_t epoch) const;
  /// The micro-batches of the samples `order`, visited in that order (what
  /// `epoch` does with its shuffle): after a change of budget, the rest of
  /// an epoch is batched anew from the samples it had left.
  std::vector<TokenBatch> batches(const std::vector<int64_t>& order) const;
  int64_t token_budget() const { return token_budget_; }
  /// Another budget (smaller after an out-of-memory, or as `--adapt`
  /// moves the step); at least the longest sample.
  void set_token_budget(int64_t token_budget);

 private:
  std::vector<int64_t> lengths_;
  std::vector<LengthBucket> buckets_;
  int64_t token_budget_;
  uint64_t seed_;
  int64_t longest_ = 0;
};

/// Length buckets cut at the data's own quantiles beside the plan's bounds.
constexpr int64_t kLengthQuantiles = 16;

/// The plan's `buckets` cut finer at the data's own lengths: a bound added
/// at each `parts`-quantile of `lengths` (each new bucket about 1/`parts` of
/// the samples), so that a micro-batch pads its samples to a length near
/// their own, as grouping by length does, while the plan's bounds and
/// micro-batches stay. A new bound's micro-batch is what `token_budget`
/// holds there, at most that of the plan's bucket below it (fewer samples
/// fit a longer length).
std::vector<LengthBucket> buckets_for_lengths(const std::vector<LengthBucket>& buckets,
                                              int64_t token_budget,
                                              const std::vector<int64_t>& lengths,
                                              int64_t parts = kLengthQuantiles);

/// The mean of `lengths` (tokens per sample); 0 for none.
double mean_length(const std::vector<int64_t>& lengths);

/// The optimizer steps of an epoch of token-budget micro-batches dealt to
/// `ranks` processes in turn (micro-batch i to rank i % ranks): a step takes
/// whole rounds, one micro-batch a rank, until their real tokens over every
/// rank reach `target_tokens`; the last step takes what is left. The rounds
/// of each step, the same on every rank, so that the ranks step together.
/// Needs `batches` a whole number of rounds; throws `batchtune::Error`
/// otherwise or for `target_tokens` or `ranks` below 1.
std::vector<int64_t> steps_by_tokens(const std::vector<TokenBatch>& batches, int64_t target_tokens,
                                     int64_t ranks);

/// Fixed batches of `batch_size` samples in a shuffled order, each padded to
/// `pad_to` tokens: the baseline a token budget is compared against.
std::vector<TokenBatch> fixed_batches(const std::vector<int64_t>& lengths, int64_t batch_size,
                                      int64_t pad_to, uint64_t seed, int64_t epoch);

/// `batch`'s samples in two halves (the same samples and tokens), the
/// shorter together so that they pad less, each padded to its own longest.
std::pair<TokenBatch, TokenBatch> split_in_halves(const TokenBatch& batch,
                                                  const std::vector<int64_t>& lengths);

/// `batches` as micro-batches within `budget` padded tokens: those above it
/// split in halves until they fit (a single sample always does: the budget
/// is at least the longest sample), in the same order.
std::vector<TokenBatch> within_budget(const std::vector<TokenBatch>& batches, int64_t budget,
                                      const std::vector<int64_t>& lengths);

}  // namespace batchtune
