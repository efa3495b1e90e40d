#include "batchtune/data/input_spec.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/common/shape.h"
#include "data/input_spec_parsing.h"

namespace batchtune {
namespace {

struct DtypeName {
  const char* name;
  c10::ScalarType dtype;
};

// The first name of each dtype is the one batchtune prints.
constexpr DtypeName kDtypeNames[] = {
    {"float32", c10::kFloat}, {"float16", c10::kHalf},  {"bfloat16", c10::kBFloat16},
    {"int64", c10::kLong},    {"float", c10::kFloat},   {"half", c10::kHalf},
    {"bf16", c10::kBFloat16}, {"long", c10::kLong},     {"fp32", c10::kFloat},
    {"fp16", c10::kHalf},
};

std::string format_dims(const InputTensorSpec& input) {
  std::string text = fmt::format("{}", fmt::join(input.shape, "x"));
  if (input.min_length > 0 && !input.shape.empty()) {
    text = fmt::format("{}..{}", input.min_length, text);
  }
  return text;
}

}  // namespace

std::string input_name(size_t index) {
  return index == 0 ? "input" : fmt::format("input{}", index);
}

TargetKind parse_target_kind(const std::string& text, const std::string& what) {
  if (text == "class") return TargetKind::kClass;
  if (text == "token") return TargetKind::kToken;
  if (text == "float" || text == "regression") return TargetKind::kRegression;
  if (text == "none") return TargetKind::kNone;
  throw Error(fmt::format("{}: unknown target kind '{}'; use class, token, float or none", what,
                          text));
}

LossKind default_loss(TargetKind kind) {
  switch (kind) {
    case TargetKind::kRegression:
      return LossKind::kMse;
    case TargetKind::kNone:
      return LossKind::kModel;
    default:
      return LossKind::kCrossEntropy;
  }
}

InputSpec classification_spec(const std::vector<int64_t>& shape, int64_t classes) {
  InputSpec spec;
  spec.inputs.push_back({shape, c10::kFloat, 0, "input"});
  spec.target = {TargetKind::kClass, classes, {}};
  return spec;
}

InputSpec token_spec(int64_t length, int64_t vocab) {
  InputSpec spec;
  spec.inputs.push_back({{length}, c10::kLong, vocab, "tokens"});
  spec.target = {TargetKind::kToken, vocab, {length}};
  return spec;
}

c10::ScalarType parse_dtype(const std::string& text, const std::string& what) {
  for (const auto& entry : kDtypeNames) {
    if (text == entry.name) return entry.dtype;
  }
  throw Error(fmt::format("{}: unknown dtype '{}'; use float32, float16, bfloat16 or int64 "
                          "(token ids)",
                          what, text));
}

std::string dtype_name(c10::ScalarType dtype) {
  for (const auto& entry : kDtypeNames) {
    if (dtype == entry.dtype) return entry.name;
  }
  return c10::toString(dtype);
}

LossKind parse_loss(const std::string& text, const std::string& what) {
  if (text == "ce" || text == "cross-entropy" || text == "cross_entropy") {
    return LossKind::kCrossEntropy;
  }
  if (text == "mse") return LossKind::kMse;
  if (text == "model") return LossKind::kModel;
  throw Error(fmt::format(
      "{}: unknown loss '{}'; use ce (cross-entropy), mse, or model (forward returns the loss)",
      what, text));
}

std::string loss_name(LossKind loss) {
  switch (loss) {
    case LossKind::kCrossEntropy:
      return "ce";
    case LossKind::kMse:
      return "mse";
    case LossKind::kModel:
      return "model";
  }
  return "?";
}

std::string target_name(TargetKind kind) {
  switch (kind) {
    case TargetKind::kClass:
      return "class";
    case TargetKind::kToken:
      return "token";
    case TargetKind::kRegression:
      return "float";
    case TargetKind::kNone:
      return "none";
  }
  return "?";
}

void validate(InputSpec& spec, const std::string& what) {
  if (spec.inputs.empty()) throw Error(fmt::format("{}: the model needs at least one input", what));
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    auto& input = spec.inputs[i];
    if (input.name.empty()) input.name = input_name(i);
    int64_t elements = 1;
    for (int64_t dim : input.shape) {
      if (dim < 1) {
        throw Error(fmt::format("{}: input '{}' has shape {}; dimensions must be at least 1",
                                what, input.name, fmt::join(input.shape, "x")));
      }
      if (__builtin_mul_overflow(elements, dim, &elements) || elements > kMaxElementsPerSample) {
        throw Error(fmt::format("{}: input '{}' has shape {}, more than {} elements per sample",
                                what, input.name, fmt::join(input.shape, "x"),
                                kMaxElementsPerSample));
      }
    }
    const bool known = input.dtype == c10::kFloat || input.dtype == c10::kHalf ||
                       input.dtype == c10::kBFloat16 || input.dtype == c10::kLong;
    if (!known) {
      throw Error(fmt::format("{}: input '{}' has dtype {}; use float32, float16, bfloat16 or "
                              "int64",
                              what, input.name, c10::toString(input.dtype)));
    }
    if (input.dtype == c10::kLong && input.vocab < 1) {
      throw Error(fmt::format("{}: input '{}' holds token ids (int64) and needs a vocabulary "
                              "size (--vocab, or \"vocab\" in a spec file)",
                              what, input.name));
    }
    if (input.dtype != c10::kLong && input.vocab != 0) {
      throw Error(fmt::format("{}: input '{}' is {}, so it takes no vocabulary; token ids are "
                              "int64",
                              what, input.name, dtype_name(input.dtype)));
    }
    if (input.min_length < 0 || (input.min_length > 0 && input.shape.empty()) ||
        (input.min_length > 0 && input.min_length > input.shape.front())) {
      throw Error(fmt::format("{}: input '{}' has the length range {}..{}; the shortest length "
                              "must be from 1 to the longest, like 16..512",
                              what, input.name, input.min_length,
                              input.shape.empty() ? 0 : input.shape.front()));
    }
    if (input.min_length == (input.shape.empty() ? -1 : input.shape.front())) input.min_length = 0;
  }
  // The sequences of one sample share one length.
  const InputTensorSpec* ranged = nullptr;
  for (const auto& input : spec.inputs) {
    if (input.min_length == 0) continue;
    if (ranged != nullptr && (ranged->min_length != input.min_length ||
                              ranged->shape.front() != input.shape.front())) {
      throw Error(fmt::format("{}: inputs '{}' and '{}' have different length ranges ({} and {}); "
                              "the sequences of one sample share one length range",
                              what, ranged->name, input.name, format_dims(*ranged),
                              format_dims(input)));
    }
    ranged = &input;
  }
  auto& target = spec.target;
  switch (target.kind) {
    case TargetKind::kClass:
    case TargetKind::kToken:
      if (target.classes < 2 || target.classes > kMaxClasses) {
        throw OptionError(Option::kClasses, fmt::format("need from 2 to {} classes, got {}",
                                                        kMaxClasses, target.classes));
      }
      if (spec.loss == LossKind::kMse) {
        throw OptionError(Option::kLoss,
                          fmt::format("mse needs float targets ({} float:SHAPE), not {} indices",
                                      mention(Option::kTarget), target_name(target.kind)));
      }
      break;
    case TargetKind::kRegression:
      if (target.shape.empty()) {
        throw Error(fmt::format("{}: a float target needs a per-sample shape, like float:1",
                                what));
      }
      if (spec.loss == LossKind::kCrossEntropy) {
        throw OptionError(Option::kLoss, "ce needs class or token targets; float targets take mse");
      }
      break;
    case TargetKind::kNone:
      if (spec.loss != LossKind::kModel) {
        throw OptionError(Option::kLoss,
                          fmt::format("{} needs targets; without targets only {} model "
                                      "(forward returns the loss) can train",
                                      loss_name(spec.loss), mention(Option::kLoss)));
      }
      break;
  }
  if (target.kind == TargetKind::kClass) target.shape.clear();
  if (target.kind == TargetKind::kToken && target.shape.empty()) {
    // The sequence is the first dimension of the first token input (else of the first input).
    const auto token_input =
        std::find_if(spec.inputs.begin(), spec.inputs.end(),
                     [](const InputTensorSpec& input) { return input.dtype == c10::kLong; });
    const auto& sequence = token_input != spec.inputs.end() ? *token_input : spec.inputs.front();
    if (sequence.shape.empty()) {
      throw Error(fmt::format("{}: per-token targets need a sequence input, like int64:128",
                              what));
    }
    target.shape = {sequence.shape.front()};
  }
  for (int64_t dim : target.shape) {
    if (dim < 1) {
      throw Error(fmt::format("{}: the target shape {} needs dimensions of at least 1", what,
                              fmt::join(target.shape, "x")));
    }
  }
}

std::string describe(const InputSpec& spec) {
  std::vector<std::string> inputs;
  for (const auto& input : spec.inputs) {
    std::string text = fmt::format("{}[{}]", dtype_name(input.dtype), format_dims(input));
    if (input.vocab > 0) text += fmt::format(" (vocab {})", input.vocab);
    inputs.push_back(std::move(text));
  }
  std::string target;
  switch (spec.target.kind) {
    case TargetKind::kClass:
      target = fmt::format("class targets, {} classes", spec.target.classes);
      break;
    case TargetKind::kToken:
      target = fmt::format("token targets, {} classes", spec.target.classes);
      break;
    case TargetKind::kRegression:
      target = fmt::format("float targets [{}]", fmt::join(spec.target.shape, "x"));
      break;
    case TargetKind::kNone:
      target = "no targets";
      break;
  }
  return fmt::format("{} -> {}, loss {}", fmt::join(inputs, ", "), target, loss_name(spec.loss));
}

std::optional<LengthRange> length_range(const InputSpec& spec) {
  for (const auto& input : spec.inputs) {
    if (input.min_length > 0 && !input.shape.empty()) {
      return LengthRange{input.min_length, input.shape.front()};
    }
  }
  return std::nullopt;
}

int64_t sequence_length(const InputSpec& spec) {
  if (const auto range = length_range(spec)) return range->max;
  for (const auto& input : spec.inputs) {
    if (input.dtype == c10::kLong && !input.shape.empty()) return input.shape.front();
  }
  return 0;
}

InputSpec at_length(const InputSpec& spec, int64_t length) {
  const auto range = length_range(spec);
  const int64_t longest = sequence_length(spec);
  if (longest == 0) {
    throw OptionError(Option::kInput,
                      fmt::format("{} holds no sequence, so it has no length to set",
                                  describe(spec)));
  }
  const int64_t shortest = range ? range->min : longest;
  if (length < shortest || length > longest) {
    throw OptionError(Option::kInput,
                      fmt::format("length {} is outside the sequence lengths {}..{} of {}", length,
                                  shortest, longest, describe(spec)));
  }
  InputSpec out = spec;
  for (auto& input : out.inputs) {
    const bool sequence = range ? input.min_length > 0 : input.dtype == c10::kLong;
    if (sequence && !input.shape.empty()) {
      input.shape.front() = length;
      input.min_length = 0;
    }
  }
  if (out.target.kind == TargetKind::kToken && !out.target.shape.empty()) {
    out.target.shape.front() = length;
  }
  return out;
}

}  // namespace batchtune
