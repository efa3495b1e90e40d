#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "batchtune/data/dataset.h"
#include "batchtune/data/input_spec.h"
#include "batchtune/data/length_bucket.h"

namespace batchtune {

/// Byte-level tokens: one token per byte, so a vocabulary of 256, `gpt`'s
/// default (`kGptDefaultVocab`).
constexpr int64_t kByteVocab = 256;
/// The target of a padded position: `cross_entropy`'s default ignore_index,
/// so padding adds nothing to the loss, and the mean is over real tokens.
constexpr int64_t kIgnoreTarget = -100;

/// A folder of text files as a language-modelling data set (`--data
/// text:DIR`): each file a document, each paragraph of a document (text
/// between blank lines) one sample of byte-level tokens; the model predicts
/// each next byte. A paragraph of n bytes is n − 1 tokens (inputs the first
/// n − 1 bytes, targets the last n − 1); one longer than `range.max` tokens
/// is cut into pieces of at most that many; pieces shorter than `range.min`
/// are dropped. Files are read in path order (recursively); a file holding
/// a NUL byte is not text and is skipped.
///
/// `get_batch` pads to the batch's longest sample (inputs with 0, targets
/// with `kIgnoreTarget`), or to `pad_to` when set (a fixed batch padded to
/// the longest sequence).
///
/// Example:
/// ```
///   batchtune::TextDataset text("/usr/share/common-licenses", {16, 512});
///   auto batch = text.get_batch({0, 1, 2});  // [3, longest of the three]
/// ```
class TextDataset final : public Dataset {
 public:
  /// Throws `batchtune::Error` naming `--data` when the folder cannot be
  /// read or holds no sample in the range.
  TextDataset(const std::string& dir, LengthRange range);

  int64_t size() const override { return static_cast<int64_t>(lengths_.size()); }
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  std::vector<int64_t> sample_shape() const override { return {range_.max}; }
  int64_t classes() const override { return kByteVocab; }
  std::string describe() const override;

  /// Tokens of each sample.
  const std::vector<int64_t>& lengths() const { return lengths_; }
  /// Files read (those that held text).
  int64_t documents() const { return documents_; }
  /// Pads every batch to this length (0: to the batch's longest).
  void set_pad_to(int64_t length) { pad_to_ = length; }
  /// The shortest and longest sample.
  LengthRange length_range() const;

 private:
  std::string dir_;
  LengthRange range_;
  at::Tensor bytes_;  // every sample's bytes, one after another (uint8)
  std::vector<int64_t> offsets_;
  std::vector<int64_t> lengths_;  // tokens: bytes − 1
  int64_t documents_ = 0;
  int64_t pad_to_ = 0;
};

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

/// Fixed batches of `batch_size` samples in a shuffled order, each padded to
/// `pad_to` tokens: the baseline a token budget is compared against.
std::vector<TokenBatch> fixed_batches(const std::vector<int64_t>& lengths, int64_t batch_size,
                                      int64_t pad_to, uint64_t seed, int64_t epoch);

}  // namespace batchtune
