#pragma once

// JPEG (libjpeg-turbo) and PNG (stb) files to pixels and back. Two
// implementations: image_codec.cpp where both libraries were found, and
// image_codec_stub.cpp, whose functions throw saying this build has none.

#include <cstdint>
#include <string>
#include <vector>

namespace batchtune {

/// Decoded pixels, row-major, `channels` bytes per pixel (interleaved).
struct Image {
  int width = 0;
  int height = 0;
  int channels = 0;
  std::vector<uint8_t> pixels;
};

/// Declared image sizes above these are refused before any pixel is
/// decoded: a 64-byte JPEG header can declare 65500x65500 (12 GB of RGB).
/// 64 megapixels is past any training image (ImageNet's largest is ~20 MP)
/// and still 192 MiB to decode.
constexpr int64_t kMaxImagePixels = int64_t{1} << 26;
constexpr int kMaxImageSide = 1 << 15;
/// An image file larger than this is not read (a 64 MP PNG compresses to
/// well under it; a link to /dev/zero or a sparse 20 GB file would be read
/// whole).
constexpr int64_t kMaxImageFileBytes = int64_t{256} << 20;

/// Whether this build can decode JPEG and PNG files.
bool image_codec_compiled();

/// Decodes the JPEG or PNG file `bytes` (read from `path`, which errors
/// name) into `channels` (1: gray, 3: RGB) channels. Throws
/// `batchtune::Error` naming `path` when the bytes are neither, corrupt, or
/// declare more than `kMaxImagePixels` / `kMaxImageSide`.
Image decode_image(const std::string& path, const std::vector<uint8_t>& bytes, int channels);

/// JPEG file bytes of `image` at `quality` (1-100): 1 channel (grey), 3
/// (RGB) or 4 (inverted CMYK, libjpeg-turbo's convention: a CMYK JPEG as
/// print tools write them).
std::vector<uint8_t> encode_jpeg(const Image& image, int quality = 90);
/// PNG file bytes of `image` (1 or 3 channels).
std::vector<uint8_t> encode_png(const Image& image);

}  // namespace batchtune
