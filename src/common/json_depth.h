#pragma once

// A bound on JSON nesting, checked on the text before nlohmann parses it:
// its parser recurses per level, and so do dump() and the destructor, so a
// file nested 100,000 deep ends the process with a stack overflow.

#include <string>

namespace batchtune {

/// Deeper than this no plan or input spec is (theirs are 3 levels).
constexpr int kMaxJsonDepth = 64;

/// Throws `batchtune::Error` starting with `source` when `text` nests arrays
/// and objects deeper than `kMaxJsonDepth` (strings are skipped).
void check_json_depth(const std::string& text, const std::string& source);

}  // namespace batchtune
