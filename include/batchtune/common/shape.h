#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace batchtune {

/// A sample with more elements than this is a typo, not a workload.
constexpr int64_t kMaxElementsPerSample = int64_t{1} << 32;

/// Parses a per-sample shape written as dimensions joined by `x`
/// (`3x64x64`, `784`). Every dimension must be a positive integer.
/// Throws `batchtune::Error` naming `what` (the flag) otherwise.
///
/// Example:
/// ```
///   parse_shape("3x64x64", "--input");  // {3, 64, 64}
/// ```
std::vector<int64_t> parse_shape(const std::string& text,
                                 const std::string& what = "shape");

/// The inverse of `parse_shape`: `{3, 64, 64}` -> `3x64x64`.
std::string format_shape(const std::vector<int64_t>& shape);

}  // namespace batchtune
