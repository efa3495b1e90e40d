#include "batchtune/data/idx_file.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <memory>

#include "batchtune/memory/budget_allocator.h"
#include "batchtune/common/error.h"

#ifdef BATCHTUNE_HAVE_ZLIB
#include <zlib.h>
#endif

namespace batchtune {
namespace {

constexpr unsigned char kUnsignedByte = 0x08;

uint32_t big_endian_u32(std::string_view bytes, size_t at) {
  const auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(bytes[at + i])); };
  return (b(0) << 24) | (b(1) << 16) | (b(2) << 8) | b(3);
}

/// The whole file, decompressed when it is gzip (zlib reads plain files as
/// they are).
std::string read_whole_file(const std::string& path) {
  std::string bytes;
  char buffer[1 << 16];
#ifdef BATCHTUNE_HAVE_ZLIB
  const std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), gzclose);
  if (!file) throw Error(fmt::format("{}: cannot open the file", path));
  for (;;) {
    const int n = gzread(file.get(), buffer, sizeof buffer);
    if (n < 0) {
      int code = 0;
      throw Error(fmt::format("{}: corrupt or not gzip ({})", path, gzerror(file.get(), &code)));
    }
    if (n == 0) break;
#else
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0) {
    throw Error(fmt::format("{}: this batchtune was built without zlib; gunzip the files in "
                            "that directory, or rebuild with zlib",
                            path));
  }
  const std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!file) throw Error(fmt::format("{}: cannot open the file", path));
  for (;;) {
    const size_t n = std::fread(buffer, 1, sizeof buffer, file.get());
    if (n == 0) break;
#endif
    bytes.append(buffer, static_cast<size_t>(n));
    if (bytes.size() > kIdxMaxBytes) {
      throw Error(fmt::format("{}: larger than {} bytes, too large for an IDX data set", path,
                              kIdxMaxBytes));
    }
  }
  return bytes;
}

}  // namespace

at::Tensor parse_idx(std::string_view bytes, const std::string& name) {
  if (bytes.size() < 4) {
    throw Error(fmt::format("{}: truncated: {} bytes, not even the 4-byte IDX magic number; "
                            "fetch the file again",
                            name, bytes.size()));
  }
  if (bytes[0] != 0 || bytes[1] != 0 || static_cast<unsigned char>(bytes[2]) != kUnsignedByte) {
    throw Error(fmt::format("{}: not an IDX file of unsigned bytes: the magic number is {:#010x}",
                            name, big_endian_u32(bytes, 0)));
  }
  const int dims = static_cast<unsigned char>(bytes[3]);
  if (dims < 1 || dims > kIdxMaxDims) {
    throw Error(fmt::format("{}: an IDX file with {} dimensions; expected 1 to {}", name, dims,
                            kIdxMaxDims));
  }
  const size_t header = 4 + 4 * static_cast<size_t>(dims);
  if (bytes.size() < header) {
    throw Error(fmt::format("{}: truncated: the header needs {} bytes, the file has {}", name,
                            header, bytes.size()));
  }
  std::vector<int64_t> sizes;
  // The product of the non-zero dimensions bounds the strides a tensor of
  // these sizes needs, even when a zero dimension makes it empty.
  size_t span = 1;
  bool empty = false;
  for (int d = 0; d < dims; ++d) {
    const uint32_t n = big_endian_u32(bytes, 4 + 4 * static_cast<size_t>(d));
    sizes.push_back(n);
    empty = empty || n == 0;
    if (n > 0 && span > kIdxMaxBytes / n) {
      throw Error(fmt::format("{}: the header's dimensions describe more than {} bytes, too "
                              "large for an IDX data set; the file is corrupt",
                              name, kIdxMaxBytes));
    }
    if (n > 0) span *= n;
  }
  const size_t elements = empty ? 0 : span;
  if (elements != bytes.size() - header) {
    throw Error(fmt::format("{}: {}: the header promises {} bytes of data, the file holds {}",
                            name, elements > bytes.size() - header ? "truncated" : "trailing bytes",
                            elements, bytes.size() - header));
  }
  // The data set lives in host memory: it is not the emulated device's.
  BudgetAllocator::UncountedScope uncounted;
  at::Tensor out = at::empty(sizes, at::TensorOptions().dtype(at::kByte));
  if (elements > 0) std::memcpy(out.data_ptr<uint8_t>(), bytes.data() + header, elements);
  return out;
}

at::Tensor read_idx(const std::string& path) { return parse_idx(read_whole_file(path), path); }

}  // namespace batchtune
