#pragma once

#include <stdexcept>
#include <string>

namespace batchtune {

/// An error in what the user gave batchtune: a flag, a file, a size, a model
/// name. The message names the input and says how to fix it; the CLI prints
/// it on one line and exits with code 2.
///
/// Example:
/// ```
///   throw batchtune::Error("--batch-size: must be at least 1, got 0");
/// ```
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The first line of an error message: LibTorch appends a C++ stack trace
/// after it, which people should not see.
inline std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace batchtune
