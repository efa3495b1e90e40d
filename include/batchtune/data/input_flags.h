#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

#include "batchtune/data/input_spec.h"

namespace batchtune {

/// Parses one `--input` value: a shape with an optional dtype prefix,
/// `3x224x224`, `float16:3x224x224`, `bfloat16:...`, `int64:128` (token ids;
/// they need `vocab` > 0). The first dimension may be a length range
/// `MIN..MAX`: `int64:16..512`, `16..512x80`. Throws `batchtune::Error`
/// naming `what`.
///
/// Example:
/// ```
///   auto tokens = batchtune::parse_input_tensor("int64:128", 32000, "--input");
/// ```
InputTensorSpec parse_input_tensor(const std::string& text, int64_t vocab,
                                   const std::string& what = "--input");

/// The command-line form of a spec: `--input` (repeat it for more inputs),
/// `--vocab`, `--classes`, `--target`, `--loss`.
///
/// `target` is `class`, `token`, `float:SHAPE` (a regression target of that
/// per-sample shape), `none`, or `auto`: per-token targets when the first
/// input is token ids and `classes` is left out (0) or equals `vocab` (a
/// language model), else class targets. `classes` left out is the vocabulary
/// for token targets and 10 for class targets. `loss` left empty is `ce` for
/// class and token targets, `mse` for float targets, `model` for none.
///
/// Example:
/// ```
///   auto spec = batchtune::parse_input_flags(
///       batchtune::InputFlags().inputs({"int64:128"}).vocab(32000).classes(32000));
///   // one int64 input of 128 tokens, per-token targets of 32000 classes, ce
/// ```
struct InputFlags {
  TORCH_ARG(std::vector<std::string>, inputs) = std::vector<std::string>{"3x64x64"};
  TORCH_ARG(int64_t, vocab) = 0;
  TORCH_ARG(int64_t, classes) = 0;
  TORCH_ARG(std::string, target) = "auto";
  TORCH_ARG(std::string, loss) = "";
};

/// Classes of class targets when `--classes` is left out.
constexpr int64_t kDefaultClasses = 10;

/// The spec the flags say, validated; throws `batchtune::Error` naming the flag.
InputSpec parse_input_flags(const InputFlags& flags);

}  // namespace batchtune
