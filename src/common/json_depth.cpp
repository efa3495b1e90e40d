#include "common/json_depth.h"

#include <fmt/format.h>

#include "batchtune/common/error.h"

namespace batchtune {

void check_json_depth(const std::string& text, const std::string& source) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, a quote included
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        throw Error(fmt::format("{}: not valid here (nested more than {} levels deep at byte "
                                "{}); a plan or input spec is a few levels deep",
                                source, kMaxJsonDepth, i));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

}  // namespace batchtune
