#include "batchtune/common/precision.h"

#include <fmt/format.h>

#include "batchtune/common/error.h"

namespace batchtune {

std::string amp_name(AmpMode mode) {
  switch (mode) {
    case AmpMode::kOff: return "off";
    case AmpMode::kBf16: return "bf16";
    case AmpMode::kFp16: return "fp16";
    case AmpMode::kAuto: return "auto";
  }
  return "off";
}

AmpMode parse_amp(const std::string& text, const std::string& what) {
  for (AmpMode mode : {AmpMode::kOff, AmpMode::kBf16, AmpMode::kFp16, AmpMode::kAuto}) {
    if (text == amp_name(mode)) return mode;
  }
  throw Error(fmt::format("{}: unknown mixed precision '{}'; use off, bf16, fp16 or auto", what,
                          text));
}

}  // namespace batchtune
