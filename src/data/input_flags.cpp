// The command-line form of a spec: --input, --vocab, --classes, --target, --loss.
#include "batchtune/data/input_flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/common/shape.h"
#include "data/input_spec_parsing.h"

namespace batchtune {

LengthRange parse_length_range(const std::string& text, const std::string& input,
                               const std::string& what) {
  const size_t dots = text.find("..");
  const std::string low = text.substr(0, dots);
  const std::string high = text.substr(dots + 2);
  const auto number = [&](const std::string& part) -> int64_t {
    const bool digits = !part.empty() && part.size() <= 12 &&
                        std::all_of(part.begin(), part.end(),
                                    [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    if (!digits) {
      throw Error(fmt::format("{}: cannot read the length range '{}' in '{}'; write MIN..MAX, like "
                              "int64:16..512",
                              what, text, input));
    }
    return std::stoll(part);
  };
  LengthRange range{number(low), number(high)};
  if (range.min < 1) {
    throw Error(fmt::format("{}: the length range {} in '{}' starts below 1; the shortest "
                            "sequence needs at least 1, like int64:16..512",
                            what, text, input));
  }
  if (range.min > range.max) {
    throw Error(fmt::format("{}: the length range {} in '{}' runs backwards; write the shortest "
                            "length first, like int64:{}..{}",
                            what, text, input, range.max, range.min));
  }
  return range;
}

InputTensorSpec parse_input_tensor(const std::string& text, int64_t vocab,
                                   const std::string& what) {
  InputTensorSpec input;
  input.name = "input";
  std::string shape = text;
  const size_t colon = text.find(':');
  if (colon != std::string::npos) {
    input.dtype = parse_dtype(text.substr(0, colon), what);
    shape = text.substr(colon + 1);
  }
  // A length range is the first dimension only: `16..512` or `16..512x80`.
  const size_t cross = shape.find_first_of("xX");
  const std::string first = shape.substr(0, cross);
  if (shape.find("..") != std::string::npos && first.find("..") == std::string::npos) {
    throw Error(fmt::format("{}: only the first dimension (the sequence) can be a length range, "
                            "like int64:16..512 or 16..512x80; got '{}'",
                            what, text));
  }
  if (first.find("..") != std::string::npos) {
    const LengthRange range = parse_length_range(first, text, what);
    const std::string rest = cross == std::string::npos ? "" : shape.substr(cross);
    input.shape = parse_shape(std::to_string(range.max) + rest, what);
    if (range.min < range.max) input.min_length = range.min;
  } else {
    input.shape = parse_shape(shape, what);
  }
  if (input.dtype == c10::kLong) {
    if (vocab > kMaxClasses) {
      throw OptionError(Option::kVocab,
                        fmt::format("must be at most {}, got {}", kMaxClasses, vocab));
    }
    if (vocab < 1) {
      throw OptionError(Option::kVocab,
                        fmt::format("token ids ({} {}) need a vocabulary size, like {} 32000", what,
                                    text, mention(Option::kVocab)));
    }
    input.vocab = vocab;
  }
  return input;
}

InputSpec parse_input_flags(const InputFlags& flags) {
  if (flags.inputs().empty()) {
    throw OptionError(Option::kInput, "give at least one input, like 3x224x224");
  }
  if (flags.vocab() < 0) {
    throw OptionError(Option::kVocab, fmt::format("must be positive, got {}", flags.vocab()));
  }
  if (flags.classes() < 0 || flags.classes() == 1) {
    throw OptionError(Option::kClasses,
                      fmt::format("need at least 2 classes, got {}", flags.classes()));
  }
  InputSpec spec;
  for (size_t i = 0; i < flags.inputs().size(); ++i) {
    InputTensorSpec input = parse_input_tensor(flags.inputs()[i], flags.vocab(), "--input");
    input.name = input_name(i);
    spec.inputs.push_back(std::move(input));
  }
  const bool any_tokens =
      std::any_of(spec.inputs.begin(), spec.inputs.end(),
                  [](const InputTensorSpec& input) { return input.dtype == c10::kLong; });
  if (flags.vocab() > 0 && !any_tokens) {
    throw OptionError(Option::kVocab,
                      fmt::format("only token-id inputs take a vocabulary, like {} int64:128 {} {}",
                                  mention(Option::kInput), mention(Option::kVocab), flags.vocab()));
  }
  const std::string& target = flags.target();
  if (target == "auto") {
    const bool language_model = spec.inputs.front().dtype == c10::kLong &&
                                (flags.classes() == 0 || flags.classes() == flags.vocab());
    spec.target.kind = language_model ? TargetKind::kToken : TargetKind::kClass;
  } else if (target.rfind("float:", 0) == 0) {
    spec.target.kind = TargetKind::kRegression;
    spec.target.shape = parse_shape(target.substr(6), "--target");
  } else if (target == "float") {
    throw OptionError(Option::kTarget, "a float target needs its per-sample shape, like float:1");
  } else {
    spec.target.kind = parse_target_kind(target, "--target");
  }
  spec.target.classes = flags.classes() > 0                          ? flags.classes()
                        : spec.target.kind == TargetKind::kToken ? flags.vocab()
                                                                 : kDefaultClasses;
  if (spec.target.kind == TargetKind::kToken && spec.target.classes < 2) {
    throw OptionError(Option::kClasses, "per-token targets need a class count (" +
                                            mention(Option::kClasses) + ", or " +
                                            mention(Option::kVocab) + " for token input)");
  }
  if (spec.target.kind == TargetKind::kRegression || spec.target.kind == TargetKind::kNone) {
    if (flags.classes() > 0) {
      throw OptionError(Option::kClasses,
                        fmt::format("{} targets take no classes", target_name(spec.target.kind)));
    }
    spec.target.classes = 0;
  }
  spec.loss = flags.loss().empty() ? default_loss(spec.target.kind) : parse_loss(flags.loss());
  validate(spec, "--input");
  return spec;
}

}  // namespace batchtune
