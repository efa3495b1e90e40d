#include "batchtune/common/shape.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <limits>

#include "batchtune/common/error.h"

namespace batchtune {

std::vector<int64_t> parse_shape(const std::string& text, const std::string& what) {
  const auto fail = [&](const std::string& why) {
    return Error(fmt::format(
        "{}: cannot read '{}' as a shape ({}); write positive dimensions "
        "joined by 'x', like 3x64x64",
        what, text, why));
  };
  std::vector<int64_t> dims;
  std::string token;
  int64_t elements = 1;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == 'x' || text[i] == 'X') {
      if (token.empty()) throw fail("empty dimension");
      if (token.size() > 12) throw fail("dimension too large");
      const int64_t dim = std::stoll(token);
      if (dim <= 0) throw fail("dimensions must be at least 1");
      if (elements > kMaxElementsPerSample / dim) throw fail("too many elements");
      elements *= dim;
      dims.push_back(dim);
      token.clear();
    } else if (std::isdigit(static_cast<unsigned char>(text[i]))) {
      token.push_back(text[i]);
    } else {
      throw fail(fmt::format("unexpected character '{}'", text[i]));
    }
  }
  return dims;
}

std::string format_shape(const std::vector<int64_t>& shape) {
  return fmt::format("{}", fmt::join(shape, "x"));
}

}  // namespace batchtune
