#include "data/image_codec.h"

#include <fmt/format.h>
#include <stb/stb_image.h>
#include <stb/stb_image_write.h>
#include <turbojpeg.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "batchtune/common/error.h"

namespace batchtune {
namespace {

constexpr uint8_t kJpegMagic[] = {0xFF, 0xD8, 0xFF};
constexpr uint8_t kPngMagic[] = {0x89, 'P', 'N', 'G'};

template <size_t N>
bool starts_with(const std::vector<uint8_t>& bytes, const uint8_t (&magic)[N]) {
  return bytes.size() >= N && std::memcmp(bytes.data(), magic, N) == 0;
}

struct TjHandle {
  explicit TjHandle(tjhandle h) : handle(h) {}
  ~TjHandle() {
    if (handle != nullptr) tjDestroy(handle);
  }
  /// A fresh decompressor: after a failure a handle keeps its error state
  /// and would fail the next, good file too.
  void reset() {
    if (handle != nullptr) tjDestroy(handle);
    handle = tjInitDecompress();
  }
  TjHandle(const TjHandle&) = delete;
  TjHandle& operator=(const TjHandle&) = delete;
  tjhandle handle;
};

void check_dimensions(const std::string& path, const char* format, int width, int height) {
  if (width < 1 || height < 1 || width > kMaxImageSide || height > kMaxImageSide ||
      static_cast<int64_t>(width) * height > kMaxImagePixels) {
    throw Error(fmt::format("{}: the {} header declares {}x{} pixels, more than this reads "
                            "({} per side, {} megapixels); resize the image",
                            path, format, width, height, kMaxImageSide,
                            kMaxImagePixels >> 20));
  }
}

/// A CMYK (or YCCK) JPEG, as print workflows and some photo tools save
/// them: TurboJPEG cannot convert those to RGB, so its CMYK pixels are
/// converted here, in libjpeg-turbo's own convention (inverted CMYK, as
/// Adobe writes it: R = C x K / 255), then to grey when one channel is asked.
void decode_cmyk_jpeg(TjHandle& tj, const std::string& path, const std::vector<uint8_t>& bytes,
                      Image& image) {
  const size_t pixels = static_cast<size_t>(image.width) * image.height;
  std::vector<uint8_t> cmyk(pixels * 4);
  if (tjDecompress2(tj.handle, bytes.data(), static_cast<unsigned long>(bytes.size()), cmyk.data(),
                    image.width, 0, image.height, TJPF_CMYK, TJFLAG_STOPONWARNING) != 0) {
    const Error error(fmt::format("{}: corrupt JPEG ({})", path, tjGetErrorStr2(tj.handle)));
    tj.reset();
    throw error;
  }
  for (size_t i = 0; i < pixels; ++i) {
    const int k = cmyk[4 * i + 3];
    const auto channel = [&](int c) {
      return static_cast<uint8_t>((cmyk[4 * i + c] * k + 127) / 255);
    };
    const uint8_t r = channel(0), g = channel(1), b = channel(2);
    if (image.channels == 1) {
      // ITU-R BT.601 luma, as libjpeg's own RGB to grey.
      image.pixels[i] = static_cast<uint8_t>((299 * r + 587 * g + 114 * b + 500) / 1000);
    } else {
      image.pixels[3 * i] = r;
      image.pixels[3 * i + 1] = g;
      image.pixels[3 * i + 2] = b;
    }
  }
}

Image decode_jpeg(const std::string& path, const std::vector<uint8_t>& bytes, int channels) {
  // One decompressor per thread: handles are not thread-safe, and making one
  // per file costs more than decoding a small image.
  thread_local TjHandle tj(tjInitDecompress());
  if (tj.handle == nullptr) throw Error(fmt::format("{}: cannot start libturbojpeg", path));
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(tj.handle, bytes.data(), static_cast<unsigned long>(bytes.size()),
                          &width, &height, &subsampling, &colorspace) != 0) {
    const Error error(fmt::format("{}: not a readable JPEG ({})", path, tjGetErrorStr2(tj.handle)));
    tj.reset();
    throw error;
  }
  check_dimensions(path, "JPEG", width, height);
  Image image;
  image.width = width;
  image.height = height;
  image.channels = channels;
  image.pixels.resize(static_cast<size_t>(width) * height * channels);
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
    decode_cmyk_jpeg(tj, path, bytes, image);
    return image;
  }
  // A truncated or damaged file is an error, not a half-grey picture.
  if (tjDecompress2(tj.handle, bytes.data(), static_cast<unsigned long>(bytes.size()),
                    image.pixels.data(), width, 0, height, channels == 1 ? TJPF_GRAY : TJPF_RGB,
                    TJFLAG_STOPONWARNING) != 0) {
    const Error error(fmt::format("{}: corrupt JPEG ({})", path, tjGetErrorStr2(tj.handle)));
    tj.reset();
    throw error;
  }
  return image;
}

Image decode_png(const std::string& path, const std::vector<uint8_t>& bytes, int channels) {
  int width = 0, height = 0, in_file = 0;
  if (stbi_info_from_memory(bytes.data(), static_cast<int>(bytes.size()), &width, &height,
                            &in_file) == 0) {
    throw Error(fmt::format("{}: corrupt PNG ({})", path, stbi_failure_reason()));
  }
  check_dimensions(path, "PNG", width, height);
  std::unique_ptr<stbi_uc, void (*)(void*)> pixels(
      stbi_load_from_memory(bytes.data(), static_cast<int>(bytes.size()), &width, &height,
                            &in_file, channels),
      stbi_image_free);
  if (!pixels) {
    throw Error(fmt::format("{}: corrupt PNG ({})", path, stbi_failure_reason()));
  }
  Image image;
  image.width = width;
  image.height = height;
  image.channels = channels;
  image.pixels.assign(pixels.get(), pixels.get() + static_cast<size_t>(width) * height * channels);
  return image;
}

void check_encodable(const Image& image) {
  if ((image.channels != 1 && image.channels != 3) || image.width < 1 || image.height < 1 ||
      image.pixels.size() != static_cast<size_t>(image.width) * image.height * image.channels) {
    throw Error(fmt::format("encode: need a 1- or 3-channel image with its pixels, got {}x{}x{}",
                            image.width, image.height, image.channels));
  }
}

void append_bytes(void* context, void* data, int size) {
  auto* out = static_cast<std::vector<uint8_t>*>(context);
  const auto* bytes = static_cast<const uint8_t*>(data);
  out->insert(out->end(), bytes, bytes + size);
}

}  // namespace

bool image_codec_compiled() { return true; }

Image decode_image(const std::string& path, const std::vector<uint8_t>& bytes, int channels) {
  if (channels != 1 && channels != 3) {
    throw Error(fmt::format("{}: images decode to 1 or 3 channels, not {}", path, channels));
  }
  if (starts_with(bytes, kJpegMagic)) return decode_jpeg(path, bytes, channels);
  if (starts_with(bytes, kPngMagic)) return decode_png(path, bytes, channels);
  throw Error(fmt::format("{}: neither a JPEG nor a PNG file ({} bytes)", path, bytes.size()));
}

std::vector<uint8_t> encode_jpeg(const Image& image, int quality) {
  const bool cmyk = image.channels == 4 && image.width >= 1 && image.height >= 1 &&
                    image.pixels.size() == static_cast<size_t>(image.width) * image.height * 4;
  if (!cmyk) check_encodable(image);
  TjHandle tj(tjInitCompress());
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  const int format = image.channels == 1 ? TJPF_GRAY : cmyk ? TJPF_CMYK : TJPF_RGB;
  const int subsampling = image.channels == 1 ? TJSAMP_GRAY : cmyk ? TJSAMP_444 : TJSAMP_420;
  if (tjCompress2(tj.handle, image.pixels.data(), image.width, 0, image.height, format, &buffer,
                  &size, subsampling, quality, 0) != 0) {
    const std::string reason = tjGetErrorStr2(tj.handle);
    tjFree(buffer);
    throw Error("encode_jpeg: " + reason);
  }
  std::vector<uint8_t> bytes(buffer, buffer + size);
  tjFree(buffer);
  return bytes;
}

std::vector<uint8_t> encode_png(const Image& image) {
  check_encodable(image);
  std::vector<uint8_t> bytes;
  if (stbi_write_png_to_func(append_bytes, &bytes, image.width, image.height, image.channels,
                             image.pixels.data(), image.width * image.channels) == 0) {
    throw Error("encode_png: stb_image_write failed");
  }
  return bytes;
}

}  // namespace batchtune
