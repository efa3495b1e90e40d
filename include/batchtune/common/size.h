#pragma once

#include <cstdint>
#include <string>

namespace batchtune {

/// Parses a byte size: a plain count (`1048576`) or a number with a unit,
/// binary (`KiB`, `MiB`, `GiB`, `TiB`) or decimal (`KB`, `MB`, `GB`, `TB`),
/// case-insensitive, with an optional space and fraction (`1.5GB`).
/// Throws `batchtune::Error` naming `what` (the flag) for anything else,
/// including zero, negative and overflowing sizes.
///
/// Example:
/// ```
///   parse_size("512MiB", "--memory-limit");  // 536870912
/// ```
int64_t parse_size(const std::string& text, const std::string& what = "size");

/// Formats a byte count for people: `512.0 MiB`, `1.50 GiB`, `812 B`.
std::string format_bytes(int64_t bytes);

}  // namespace batchtune
