#pragma once

// What the two readers of a spec, the flags (input_flags.cpp) and a JSON file
// (input_spec_json.cpp), share with the spec itself (input_spec.cpp).

#include <cstddef>
#include <cstdint>
#include <string>

#include "batchtune/data/input_spec.h"

namespace batchtune {

// More classes than this is a typo (the largest vocabularies are ~256k).
constexpr int64_t kMaxClasses = int64_t{1} << 31;

/// The name of input `index` when the spec gives none: "input", "input1", ...
std::string input_name(size_t index);

/// A length range `MIN..MAX` (`text`, as written in `input`), checked; errors
/// name `what` and say how to write one.
LengthRange parse_length_range(const std::string& text, const std::string& input,
                               const std::string& what);

/// `class`, `token`, `float` (or `regression`) or `none`; errors name `what`.
TargetKind parse_target_kind(const std::string& text, const std::string& what);

/// The loss of a spec that names none: ce for class and token targets, mse
/// for float targets, model for none.
LossKind default_loss(TargetKind kind);

}  // namespace batchtune
