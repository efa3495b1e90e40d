#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <string_view>

namespace batchtune {

/// The IDX format of MNIST and Fashion-MNIST: a big-endian magic number
/// (two zero bytes, the element type — 0x08, unsigned byte, the only one
/// read here — and the number of dimensions), one big-endian u32 per
/// dimension, then the elements. Returns them as a uint8 tensor of those
/// dimensions, in host memory. Anything malformed — a short header, another
/// element type, no or more than `kIdxMaxDims` dimensions, a size that does
/// not match the bytes — throws `batchtune::Error` naming `name`.
///
/// Example:
/// ```
///   at::Tensor images = batchtune::parse_idx(bytes, "train-images-idx3-ubyte");
///   // images.sizes() == {60000, 28, 28}
/// ```
at::Tensor parse_idx(std::string_view bytes, const std::string& name);

/// `parse_idx` over the whole file at `path`, gzip-compressed or not (with
/// zlib; without it, `.gz` files are refused with a message saying so).
at::Tensor read_idx(const std::string& path);

/// More dimensions than any IDX file in use has (MNIST's are 1 and 3).
constexpr int kIdxMaxDims = 4;
/// Largest file read: a bound on what a corrupt or hostile file can make
/// the reader allocate (Fashion-MNIST's largest is 47 MB unpacked).
constexpr size_t kIdxMaxBytes = size_t{1} << 31;

}  // namespace batchtune
