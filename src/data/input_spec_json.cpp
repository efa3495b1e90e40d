// A spec written as JSON (--input-spec FILE): every error names the file and the field.
#include "batchtune/data/input_spec_json.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <type_traits>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/common/file_roles.h"
#include "common/json_depth.h"
#include "data/input_spec_parsing.h"

namespace batchtune {
namespace {

using nlohmann::json;

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

}  // namespace

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
  check_input_file(path, Option::kInputSpec);
  std::ifstream file(path);
  if (!file) throw OptionError(Option::kInputSpec, fmt::format("cannot read '{}'", path));
  std::ostringstream text;
  text << file.rdbuf();
  return parse_input_spec_json(text.str(), fmt::format("--input-spec {}", path));
}

}  // namespace batchtune
