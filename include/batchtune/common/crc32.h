#pragma once

#include <cstddef>
#include <cstdint>

namespace batchtune {

/// CRC-32 (the zlib / PNG polynomial) of `size` bytes; `crc` continues an
/// earlier one.
///
/// Example:
/// ```
///   uint32_t crc = batchtune::crc32_of("123456789", 9);  // 0xCBF43926
/// ```
uint32_t crc32_of(const void* data, size_t size, uint32_t crc = 0);

}  // namespace batchtune
