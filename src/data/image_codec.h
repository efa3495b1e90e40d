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

/// Whether this build can decode JPEG and PNG files.
bool image_codec_compiled();

/// Decodes the JPEG or PNG file `bytes` (read from `path`, which errors
/// name) into `channels` (1: gray, 3: RGB) channels. Throws
/// `batchtune::Error` naming `path` when the bytes are neither, or corrupt.
Image decode_image(const std::string& path, const std::vector<uint8_t>& bytes, int channels);

/// JPEG file bytes of `image` (1 or 3 channels) at `quality` (1-100).
std::vector<uint8_t> encode_jpeg(const Image& image, int quality = 90);
/// PNG file bytes of `image` (1 or 3 channels).
std::vector<uint8_t> encode_png(const Image& image);

}  // namespace batchtune
