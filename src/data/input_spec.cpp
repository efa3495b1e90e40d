#include "batchtune/data/input_spec.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>
#include <type_traits>

#include "batchtune/common/error.h"
#include "batchtune/common/file_roles.h"
#include "common/json_depth.h"
#include "batchtune/common/shape.h"

namespace batchtune {
namespace {

using nlohmann::json;

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

// More classes than this is a typo (the largest vocabularies are ~256k).
constexpr int64_t kMaxClasses = int64_t{1} << 31;

std::string input_name(size_t index) {
  return index == 0 ? "input" : fmt::format("input{}", index);
}

/// The field `key` of `object` as `T`, or a one-line error naming `where`.
template <typename T>
T field(const json& object, const char* key, const std::string& where, const char* expected) {
  const json& value = object.at(key);
  const auto wrong_type = [&] {
    // `where` is "FILE: inputs[0]" for a nested field, "FILE" for a top-level one.
    const char* join = where.find(": ") == std::string::npos ? ": " : ".";
    return Error(fmt::format("{}{}{}: expected {}, got {}", where, join, key, expected,
                             value.dump()));
  };
  if constexpr (std::is_same_v<T, int64_t>) {
    // get<int64_t>() would truncate 10.5 to 10 and wrap 2^64-1 to -1.
    if (!value.is_number_integer() ||
        (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
      throw wrong_type();
    }
  }
  try {
    return value.get<T>();
  } catch (const json::exception&) {
    throw wrong_type();
  }
}

void check_keys(const json& object, const std::string& where,
                std::initializer_list<const char*> known) {
  if (!object.is_object()) {
    throw Error(fmt::format("{}: expected an object, got {}", where, object.dump()));
  }
  for (const auto& item : object.items()) {
    const std::string& key = item.key();
    if (std::find_if(known.begin(), known.end(), [&](const char* k) { return key == k; }) ==
        known.end()) {
      throw Error(fmt::format("{}: unknown field '{}'; known fields are {}", where, key,
                              fmt::join(known, ", ")));
    }
  }
}

/// A length range `MIN..MAX` (`text`, as written in `input`), checked; errors
/// name `what` and say how to write one.
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

std::string format_dims(const InputTensorSpec& input) {
  std::string text = fmt::format("{}", fmt::join(input.shape, "x"));
  if (input.min_length > 0 && !input.shape.empty()) {
    text = fmt::format("{}..{}", input.min_length, text);
  }
  return text;
}

/// The `shape` of a JSON object; with `min_length`, its first dimension may
/// be a length range ("16..512"), whose shortest length goes there.
std::vector<int64_t> json_shape(const json& object, const std::string& where,
                                int64_t* min_length = nullptr) {
  if (!object.contains("shape")) throw Error(fmt::format("{}.shape: missing", where));
  const json& shape = object.at("shape");
  if (!shape.is_array()) {
    throw Error(
        fmt::format("{}.shape: expected a list of dimensions like [3, 224, 224], got {}", where,
                    shape.dump()));
  }
  std::vector<int64_t> dims;
  for (const json& dim : shape) {
    if (dim.is_string() && dims.empty() && min_length != nullptr) {
      // A length range, as on the command line: "shape": ["16..512"].
      const std::string text = dim.get<std::string>();
      if (text.find("..") == std::string::npos) {
        throw Error(fmt::format("{}.shape: a string dimension is a length range MIN..MAX, like "
                                "[\"16..512\"]; got {}",
                                where, shape.dump()));
      }
      const LengthRange range = parse_length_range(text, shape.dump(), where + ".shape");
      if (range.min < range.max) *min_length = range.min;
      dims.push_back(range.max);
      continue;
    }
    if (!dim.is_number_integer() || dim.get<int64_t>() < 1) {
      throw Error(fmt::format("{}.shape: dimensions must be positive integers, got {}", where,
                              shape.dump()));
    }
    dims.push_back(dim.get<int64_t>());
  }
  return dims;
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

}  // namespace

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
      throw Error(fmt::format("--vocab: must be at most {}, got {}", kMaxClasses, vocab));
    }
    if (vocab < 1) {
      throw Error(fmt::format("--vocab: token ids ({} {}) need a vocabulary size, like --vocab "
                              "32000",
                              what, text));
    }
    input.vocab = vocab;
  }
  return input;
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
        throw Error(fmt::format("--classes: need from 2 to {} classes, got {}", kMaxClasses,
                                target.classes));
      }
      if (spec.loss == LossKind::kMse) {
        throw Error(fmt::format("--loss: mse needs float targets (--target float:SHAPE), not "
                                "{} indices",
                                target_name(target.kind)));
      }
      break;
    case TargetKind::kRegression:
      if (target.shape.empty()) {
        throw Error(fmt::format("{}: a float target needs a per-sample shape, like float:1",
                                what));
      }
      if (spec.loss == LossKind::kCrossEntropy) {
        throw Error("--loss: ce needs class or token targets; float targets take mse");
      }
      break;
    case TargetKind::kNone:
      if (spec.loss != LossKind::kModel) {
        throw Error(fmt::format("--loss: {} needs targets; without targets only --loss model "
                                "(forward returns the loss) can train",
                                loss_name(spec.loss)));
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

InputSpec parse_input_flags(const InputFlags& flags) {
  if (flags.inputs().empty()) throw Error("--input: give at least one input, like 3x224x224");
  if (flags.vocab() < 0) throw Error(fmt::format("--vocab: must be positive, got {}", flags.vocab()));
  if (flags.classes() < 0 || flags.classes() == 1) {
    throw Error(fmt::format("--classes: need at least 2 classes, got {}", flags.classes()));
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
    throw Error(fmt::format("--vocab: only token-id inputs take a vocabulary, like --input "
                            "int64:128 --vocab {}",
                            flags.vocab()));
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
    throw Error("--target: a float target needs its per-sample shape, like float:1");
  } else {
    spec.target.kind = parse_target_kind(target, "--target");
  }
  spec.target.classes = flags.classes() > 0                          ? flags.classes()
                        : spec.target.kind == TargetKind::kToken ? flags.vocab()
                                                                 : kDefaultClasses;
  if (spec.target.kind == TargetKind::kToken && spec.target.classes < 2) {
    throw Error("--classes: per-token targets need a class count (--classes, or --vocab for "
                "token input)");
  }
  if (spec.target.kind == TargetKind::kRegression || spec.target.kind == TargetKind::kNone) {
    if (flags.classes() > 0) {
      throw Error(fmt::format("--classes: {} targets take no classes", target_name(spec.target.kind)));
    }
    spec.target.classes = 0;
  }
  spec.loss = flags.loss().empty() ? default_loss(spec.target.kind) : parse_loss(flags.loss());
  validate(spec, "--input");
  return spec;
}

InputSpec parse_input_spec_json(const std::string& text, const std::string& what) {
  check_json_depth(text, what);
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {  // syntax, and numbers out of range
    std::string message = e.what();
    throw Error(fmt::format("{}: not valid JSON ({})", what, message.substr(message.find(' ') + 1)));
  }
  check_keys(root, what, {"inputs", "target", "loss"});
  if (!root.contains("inputs") || !root["inputs"].is_array() || root["inputs"].empty()) {
    throw Error(fmt::format("{}: inputs: expected a list of at least one input, like "
                            "[{{\"shape\": [3, 224, 224], \"dtype\": \"float32\"}}]",
                            what));
  }
  InputSpec spec;
  for (size_t i = 0; i < root["inputs"].size(); ++i) {
    const json& object = root["inputs"][i];
    const std::string where = fmt::format("{}: inputs[{}]", what, i);
    check_keys(object, where, {"name", "shape", "dtype", "vocab"});
    InputTensorSpec input;
    input.name = object.contains("name") ? field<std::string>(object, "name", where, "a string")
                                         : input_name(i);
    input.shape = json_shape(object, where, &input.min_length);
    if (object.contains("dtype")) {
      input.dtype = parse_dtype(field<std::string>(object, "dtype", where, "a string"),
                                where + ".dtype");
    }
    if (object.contains("vocab")) {
      input.vocab = field<int64_t>(object, "vocab", where, "an integer");
      if (input.vocab < 1 || input.vocab > kMaxClasses) {
        throw Error(fmt::format("{}.vocab: must be from 1 to {}, got {}", where, kMaxClasses,
                                input.vocab));
      }
    }
    if (input.dtype == c10::kLong && input.vocab == 0) {
      throw Error(fmt::format("{}.vocab: int64 inputs are token ids and need a vocabulary size",
                              where));
    }
    spec.inputs.push_back(std::move(input));
  }
  if (root.contains("target")) {
    const json& object = root["target"];
    const std::string where = fmt::format("{}: target", what);
    if (object.is_string()) {
      spec.target.kind = parse_target_kind(object.get<std::string>(), where);
    } else {
      check_keys(object, where, {"kind", "classes", "shape"});
      if (!object.contains("kind")) {
        throw Error(fmt::format("{}.kind: missing; use class, token, float or none", where));
      }
      spec.target.kind = parse_target_kind(field<std::string>(object, "kind", where, "a string"),
                                           where + ".kind");
      if (object.contains("classes")) {
        spec.target.classes = field<int64_t>(object, "classes", where, "an integer");
      } else if (spec.target.kind == TargetKind::kClass ||
                 spec.target.kind == TargetKind::kToken) {
        const auto vocab = std::find_if(spec.inputs.begin(), spec.inputs.end(),
                                        [](const InputTensorSpec& in) { return in.vocab > 0; });
        if (spec.target.kind == TargetKind::kClass || vocab == spec.inputs.end()) {
          throw Error(fmt::format("{}.classes: missing; give the number of classes", where));
        }
        spec.target.classes = vocab->vocab;  // a language model predicts its own tokens
      }
      if (object.contains("shape")) spec.target.shape = json_shape(object, where);
    }
  } else {
    throw Error(fmt::format("{}: target: missing; like {{\"kind\": \"class\", \"classes\": 10}}",
                            what));
  }
  spec.loss = root.contains("loss")
                  ? parse_loss(field<std::string>(root, "loss", what, "a string"),
                               what + ": loss")
                  : default_loss(spec.target.kind);
  validate(spec, what);
  return spec;
}

InputSpec load_input_spec(const std::string& path) {
  check_input_file(path, "--input-spec");
  std::ifstream file(path);
  if (!file) throw Error(fmt::format("--input-spec: cannot read '{}'", path));
  std::ostringstream text;
  text << file.rdbuf();
  return parse_input_spec_json(text.str(), fmt::format("--input-spec {}", path));
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
    throw Error(fmt::format("--input: {} holds no sequence, so it has no length to set",
                            describe(spec)));
  }
  const int64_t shortest = range ? range->min : longest;
  if (length < shortest || length > longest) {
    throw Error(fmt::format("--input: length {} is outside the sequence lengths {}..{} of {}",
                            length, shortest, longest, describe(spec)));
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
