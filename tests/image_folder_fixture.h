#pragma once

// A small image folder written by a test: JPEG and PNG files of different
// sizes in a few class folders, removed again at the end.

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "data/image_codec.h"

/// Skips a test that writes image files in a build without libturbojpeg/stb.
#define BATCHTUNE_REQUIRE_IMAGES()                                                  \
  if (!batchtune::image_codec_compiled()) {                                         \
    GTEST_SKIP() << "built without libturbojpeg and stb: no image folders";         \
  }

namespace batchtune::testing {

/// Pixels that differ by class (a colour per class) and sample (noise).
inline Image test_image(int width, int height, int label, std::mt19937& rng) {
  Image image;
  image.width = width;
  image.height = height;
  image.channels = 3;
  image.pixels.resize(static_cast<size_t>(width) * height * 3);
  std::uniform_int_distribution<int> noise(0, 60);
  for (size_t i = 0; i < image.pixels.size(); ++i) {
    const int base = (i % 3 == static_cast<size_t>(label % 3)) ? 180 : 40;
    image.pixels[i] = static_cast<uint8_t>(base + noise(rng));
  }
  return image;
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

/// Removes a directory tree of plain files (POSIX: no std::filesystem).
inline void remove_tree(const std::string& dir) {
  if (DIR* handle = ::opendir(dir.c_str())) {
    while (const dirent* entry = ::readdir(handle)) {
      const std::string name = entry->d_name;
      if (name == "." || name == "..") continue;
      const std::string path = dir + "/" + name;
      struct stat st{};
      if (::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        remove_tree(path);
      } else {
        ::unlink(path.c_str());
      }
    }
    ::closedir(handle);
  }
  ::rmdir(dir.c_str());
}

/// `classes` folders (`class0`, ...) of `per_class` images each, every
/// other one a PNG, sizes between 20 and 90 pixels a side.
class ImageFolder {
 public:
  ImageFolder(int classes, int per_class, uint32_t seed = 1) {
    char dir_template[] = "/tmp/batchtune-images-XXXXXX";
    if (::mkdtemp(dir_template) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = dir_template;
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> side(20, 90);
    for (int c = 0; c < classes; ++c) {
      const std::string class_dir = dir_ + "/class" + std::to_string(c);
      ::mkdir(class_dir.c_str(), 0755);
      for (int i = 0; i < per_class; ++i) {
        const Image image = test_image(side(rng), side(rng), c, rng);
        const bool png = i % 2 == 1;
        const std::string path =
            class_dir + "/img" + std::to_string(100 + i) + (png ? ".png" : ".jpg");
        write_bytes(path, png ? encode_png(image) : encode_jpeg(image));
        files_.push_back(path);
      }
    }
  }
  ~ImageFolder() { remove_tree(dir_); }
  ImageFolder(const ImageFolder&) = delete;
  ImageFolder& operator=(const ImageFolder&) = delete;

  const std::string& dir() const { return dir_; }
  /// The files written, in the dataset's order (class, then name).
  const std::vector<std::string>& files() const { return files_; }

 private:
  std::string dir_;
  std::vector<std::string> files_;
};

}  // namespace batchtune::testing
