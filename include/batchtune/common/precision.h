#pragma once

#include <string>

namespace batchtune {

/// Mixed precision of a plan. `kAuto` is only ever asked for: `choose_amp`
/// (`step/amp.h`) turns it into one of the other three before a plan holds
/// it. A plain value here, below the layers that measure it (`step/`) and
/// the ones that record it (`plan/`).
enum class AmpMode { kOff, kBf16, kFp16, kAuto };

/// `off`, `bf16`, `fp16`, `auto`.
std::string amp_name(AmpMode mode);
/// Parses `off|bf16|fp16|auto`, the value of `Option::kAmp`; throws
/// `OptionError` about it.
AmpMode parse_amp(const std::string& text);
/// The same for a value that no option gave (a checkpoint's record); throws
/// `batchtune::Error` naming `what`.
AmpMode parse_amp(const std::string& text, const std::string& what);

}  // namespace batchtune
