#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "batchtune/data/dataset.h"
#include "batchtune/data/input_spec.h"

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
  /// The folder read (`text:DIR`'s DIR).
  const std::string& dir() const { return dir_; }
  /// CRC-32 of every sample's bytes and then their lengths, in order: what
  /// the data is, where a count of paragraphs would not tell an edited word.
  uint32_t digest() const { return digest_; }

 private:
  std::string dir_;
  LengthRange range_;
  at::Tensor bytes_;  // every sample's bytes, one after another (uint8)
  std::vector<int64_t> offsets_;
  std::vector<int64_t> lengths_;  // tokens: bytes − 1
  int64_t documents_ = 0;
  int64_t pad_to_ = 0;
  uint32_t digest_ = 0;
};

}  // namespace batchtune
