#include "batchtune/common/precision.h"

#include <fmt/format.h>

#include <optional>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"

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

namespace {

std::optional<AmpMode> find_amp(const std::string& text) {
  for (AmpMode mode : {AmpMode::kOff, AmpMode::kBf16, AmpMode::kFp16, AmpMode::kAuto}) {
    if (text == amp_name(mode)) return mode;
  }
  return std::nullopt;
}

std::string unknown_amp(const std::string& text) {
  return fmt::format("unknown mixed precision '{}'; use off, bf16, fp16 or auto", text);
}

}  // namespace

AmpMode parse_amp(const std::string& text) {
  if (const auto mode = find_amp(text)) return *mode;
  throw OptionError(Option::kAmp, unknown_amp(text));
}

AmpMode parse_amp(const std::string& text, const std::string& what) {
  if (const auto mode = find_amp(text)) return *mode;
  throw Error(what + ": " + unknown_amp(text));
}

}  // namespace batchtune
