#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace batchtune {

/// One input of the model's forward: its per-sample shape (no batch
/// dimension: the batch is always the first dimension of the tensor the
/// model gets) and its dtype. Token ids are `int64` with a vocabulary size.
///
/// For sequences, the shape holds the longest sequence training will see:
/// a probe must measure the worst case. Sequences whose length varies give
/// the shortest too (`min_length`, `int64:16..512` on the command line): the
/// first dimension then runs from `min_length` to `shape[0]`.
struct InputTensorSpec {
  /// Per-sample shape: `{3, 224, 224}` for images, `{128}` for 128 tokens;
  /// for a length range, the longest (`{512}` for `int64:16..512`).
  std::vector<int64_t> shape;
  /// `at::kFloat`, `at::kHalf`, `at::kBFloat16` or `at::kLong` (token ids).
  c10::ScalarType dtype = c10::kFloat;
  /// Token ids are drawn from [0, vocab); only for `at::kLong`.
  int64_t vocab = 0;
  /// For people: the name in a JSON spec, else "input", "input1", ...
  std::string name;
  /// The shortest length of the first dimension when it is a range (16 for
  /// `int64:16..512`); 0 for a fixed shape.
  int64_t min_length = 0;
};

/// What the model is trained to predict.
enum class TargetKind {
  kClass,       ///< one class index per sample: target [B], output [B, classes]
  kToken,       ///< one class index per token: target [B, T], output [B, T, classes]
  kRegression,  ///< float values: target [B, ...shape], output the same shape
  kNone,        ///< no target (only with `LossKind::kModel`)
};

/// How the loss is computed from the model's output.
enum class LossKind {
  kCrossEntropy,  ///< class or token targets
  kMse,           ///< regression targets
  kModel,         ///< the model's forward returns the loss, a scalar
};

/// The targets of a workload.
struct TargetSpec {
  TargetKind kind = TargetKind::kClass;
  /// Classes of `kClass` and `kToken` targets: labels are drawn from [0, classes).
  int64_t classes = 10;
  /// Per-sample shape: `{}` for `kClass`, `{T}` for `kToken`, anything for
  /// `kRegression`.
  std::vector<int64_t> shape;
};

/// Everything a workload needs to know about its data: the model's inputs,
/// the targets and the loss. Synthetic batches follow it.
///
/// With `LossKind::kModel` the model's forward gets the inputs followed by
/// the target (unless the target is `kNone`) and returns the loss.
///
/// Example:
/// ```
///   // A language model over 128 tokens of a 32000-word vocabulary.
///   auto spec = batchtune::token_spec(128, 32000);
///   // The classic image classifier.
///   auto images = batchtune::classification_spec({3, 224, 224}, 1000);
/// ```
struct InputSpec {
  std::vector<InputTensorSpec> inputs;
  TargetSpec target;
  LossKind loss = LossKind::kCrossEntropy;
};

/// One float32 input of `shape` and `classes` class targets, cross-entropy:
/// what `--input 3x224x224 --classes 1000` means.
InputSpec classification_spec(const std::vector<int64_t>& shape, int64_t classes);

/// `length` token ids from a vocabulary of `vocab`, and the next token of
/// each position as per-token targets (classes = vocab), cross-entropy: a
/// language model.
InputSpec token_spec(int64_t length, int64_t vocab);

/// Parses `float32`, `float16`, `bfloat16`, `int64` (and the aliases
/// `float`, `half`, `bf16`, `long`); throws `batchtune::Error` naming `what`.
c10::ScalarType parse_dtype(const std::string& text, const std::string& what);
/// `float32`, `float16`, `bfloat16` or `int64`.
std::string dtype_name(c10::ScalarType dtype);

/// Parses `ce`, `mse` or `model`; throws `batchtune::Error` naming `what`.
LossKind parse_loss(const std::string& text, const std::string& what = "--loss");
std::string loss_name(LossKind loss);
std::string target_name(TargetKind kind);

/// Checks that the spec is complete and consistent (at least one input,
/// positive dimensions, a vocabulary for token ids, targets that suit the
/// loss, token targets that match a sequence input), filling in the
/// per-token target shape when it is empty. Throws `batchtune::Error`
/// naming `what` (the flag or file the spec came from).
void validate(InputSpec& spec, const std::string& what = "--input");

/// For people, one line: `int64[128] (vocab 32000) -> token targets, 32000 classes, ce`.
/// A length range reads `int64[16..512]`.
std::string describe(const InputSpec& spec);

/// The lengths a sequence input's first dimension takes.
struct LengthRange {
  int64_t min = 0;
  int64_t max = 0;
};

/// The spec's length range: that of its ranged inputs (a validated spec
/// gives them all the same one); nullopt when every shape is fixed.
std::optional<LengthRange> length_range(const InputSpec& spec);

/// Tokens per sample of a sequence workload: the longest length of a ranged
/// input, else the first dimension of the first token-id (int64) input; 0
/// when the input is no sequence (images). What `tokens_per_s` counts.
int64_t sequence_length(const InputSpec& spec);

/// The spec with its sequences `length` long: every ranged input's first
/// dimension, and per-token targets, set to `length` (a fixed spec's token
/// inputs likewise). Throws `batchtune::Error` for a length outside the range.
///
/// Example:
/// ```
///   auto spec = batchtune::parse_input_flags(
///       batchtune::InputFlags().inputs({"int64:16..512"}).vocab(256));
///   auto shortest = batchtune::at_length(spec, 16);  // int64[16] -> token targets [16]
/// ```
InputSpec at_length(const InputSpec& spec, int64_t length);

}  // namespace batchtune

// The two written forms of a spec, the flags and a JSON file, so that
// including this header gives the whole of it.
#include "batchtune/data/input_flags.h"
#include "batchtune/data/input_spec_json.h"
