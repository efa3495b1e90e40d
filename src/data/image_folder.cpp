#include "batchtune/data/image_folder.h"

#include <ATen/ATen.h>
#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/common/shape.h"
#include "data/image_codec.h"

namespace batchtune {
namespace {

bool is_directory(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

/// Entries of `dir` in name order, hidden ones left out.
std::vector<std::string> list_directory(const std::string& dir) {
  DIR* handle = ::opendir(dir.c_str());
  if (handle == nullptr) {
    throw OptionError(Option::kData, "imagefolder:" + dir,
                      fmt::format("cannot open the directory ({})", std::strerror(errno)));
  }
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(handle)) {
    if (entry->d_name[0] != '.') names.emplace_back(entry->d_name);
  }
  ::closedir(handle);
  std::sort(names.begin(), names.end());
  return names;
}

bool is_image_name(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* ext : {".jpg", ".jpeg", ".png"}) {
    const size_t n = std::strlen(ext);
    if (name.size() > n && name.compare(name.size() - n, n, ext) == 0) return true;
  }
  return false;
}

std::vector<uint8_t> read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
  std::vector<uint8_t> bytes;
  struct stat st{};
  const auto too_large = [&] {
    ::close(fd);
    return Error(fmt::format("{}: larger than {} MiB, more than an image file this reads; "
                             "resize it",
                             path, kMaxImageFileBytes >> 20));
  };
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    // A link to /dev/zero or a FIFO would be read forever.
    ::close(fd);
    throw Error(fmt::format("{}: not a regular file; an image must be a file", path));
  }
  if (st.st_size > kMaxImageFileBytes) throw too_large();  // a sparse 20 GB file
  if (st.st_size > 0) bytes.reserve(static_cast<size_t>(st.st_size));
  uint8_t chunk[1 << 16];
  for (;;) {
    if (static_cast<int64_t>(bytes.size()) > kMaxImageFileBytes) throw too_large();
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      ::close(fd);
      throw Error(fmt::format("{}: cannot read ({})", path, std::strerror(error)));
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), chunk, chunk + n);
  }
  ::close(fd);
  return bytes;
}

/// splitmix64: spreads (seed, draw, index) over the generator's seeds.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/// Where output coordinate i (0..out-1) of a crop starting at `offset` in an
/// image scaled by `scale` samples the source (bilinear, pixel centres).
struct Taps {
  std::vector<int> lo, hi;
  std::vector<float> weight;  // of `hi`
};

Taps taps(int out, double offset, double scale, int source) {
  Taps t;
  t.lo.resize(static_cast<size_t>(out));
  t.hi.resize(static_cast<size_t>(out));
  t.weight.resize(static_cast<size_t>(out));
  for (int i = 0; i < out; ++i) {
    const double s = std::clamp((offset + i + 0.5) / scale - 0.5, 0.0, source - 1.0);
    const int lo = static_cast<int>(std::floor(s));
    t.lo[static_cast<size_t>(i)] = lo;
    t.hi[static_cast<size_t>(i)] = std::min(lo + 1, source - 1);
    t.weight[static_cast<size_t>(i)] = static_cast<float>(s - lo);
  }
  return t;
}

}  // namespace

ImageFolderDataset::ImageFolderDataset(std::string dir, ImageFolderOptions options)
    : dir_(std::move(dir)), options_(std::move(options)) {
  const auto& shape = options_.sample_shape();
  if (shape.size() != 3 || (shape[0] != 1 && shape[0] != 3) || shape[1] < 1 || shape[2] < 1) {
    throw OptionError(Option::kInput,
                      fmt::format("images are CxHxW with C 1 (gray) or 3 (RGB), got {}; use e.g. "
                                  "{} 3x64x64",
                                  format_shape(shape), mention(Option::kInput)));
  }
  if (!image_codec_compiled()) decode_image(dir_, {}, 3);  // throws: not built
  if (!is_directory(dir_)) {
    throw OptionError(Option::kData, "imagefolder:" + dir_,
                      "not a directory; give a folder with one sub-folder of images per class");
  }
  for (const std::string& name : list_directory(dir_)) {
    const std::string class_dir = dir_ + "/" + name;
    if (!is_directory(class_dir)) continue;
    const auto label = static_cast<int64_t>(class_names_.size());
    size_t before = files_.size();
    for (const std::string& file : list_directory(class_dir)) {
      if (is_image_name(file)) {
        files_.push_back(class_dir + "/" + file);
        labels_.push_back(label);
      }
    }
    if (files_.size() == before) {
      throw OptionError(Option::kData, "imagefolder:" + dir_,
                        fmt::format("the class folder {} holds no .jpg, .jpeg or .png files; add "
                                    "images or remove it",
                                    class_dir));
    }
    class_names_.push_back(name);
  }
  if (class_names_.size() < 2) {
    throw OptionError(Option::kData, "imagefolder:" + dir_,
                      fmt::format("found {} class folder(s); need at least 2 sub-folders, one per "
                                  "class, holding .jpg/.jpeg/.png files",
                                  class_names_.size()));
  }
}

void ImageFolderDataset::load(int64_t index, bool augment, uint64_t draw, float* out) const {
  const std::string& file = path(index);
  const int channels = static_cast<int>(options_.sample_shape()[0]);
  const int height = static_cast<int>(options_.sample_shape()[1]);
  const int width = static_cast<int>(options_.sample_shape()[2]);
  Image image;
  try {
    image = decode_image(file, read_file(file), channels);
  } catch (const std::bad_alloc&) {  // a file --skip-bad-samples can skip
    throw Error(fmt::format("{}: out of host memory decoding the image", file));
  }

  // Scale so the output fits kImageResizeRatio times over, then crop.
  const double scale = kImageResizeRatio * std::max(static_cast<double>(height) / image.height,
                                                    static_cast<double>(width) / image.width);
  const double room_y = std::max(0.0, image.height * scale - height);
  const double room_x = std::max(0.0, image.width * scale - width);
  double offset_y = room_y / 2;
  double offset_x = room_x / 2;
  bool flip = false;
  if (augment) {
    std::mt19937_64 rng(mix(mix(options_.seed() ^ mix(draw)) + static_cast<uint64_t>(index)));
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    offset_y = std::floor(unit(rng) * (room_y + 1));
    offset_x = std::floor(unit(rng) * (room_x + 1));
    offset_y = std::min(offset_y, room_y);
    offset_x = std::min(offset_x, room_x);
    flip = unit(rng) < 0.5;
  }
  const Taps ys = taps(height, offset_y, scale, image.height);
  Taps xs = taps(width, offset_x, scale, image.width);
  if (flip) {
    std::reverse(xs.lo.begin(), xs.lo.end());
    std::reverse(xs.hi.begin(), xs.hi.end());
    std::reverse(xs.weight.begin(), xs.weight.end());
  }
  const size_t plane = static_cast<size_t>(height) * width;
  const size_t row_bytes = static_cast<size_t>(image.width) * channels;
  for (int c = 0; c < channels; ++c) {
    const double mean = channels == 3 ? kImageNetMean[c] : kGrayMean;
    const double stdev = channels == 3 ? kImageNetStd[c] : kGrayStd;
    // (p / 255 - mean) / std as p * a + b.
    const auto a = static_cast<float>(1.0 / (255.0 * stdev));
    const auto b = static_cast<float>(-mean / stdev);
    float* dst = out + c * plane;
    for (int y = 0; y < height; ++y) {
      const uint8_t* top = image.pixels.data() + ys.lo[static_cast<size_t>(y)] * row_bytes + c;
      const uint8_t* bottom = image.pixels.data() + ys.hi[static_cast<size_t>(y)] * row_bytes + c;
      const float wy = ys.weight[static_cast<size_t>(y)];
      for (int x = 0; x < width; ++x) {
        const size_t lo = static_cast<size_t>(xs.lo[static_cast<size_t>(x)]) * channels;
        const size_t hi = static_cast<size_t>(xs.hi[static_cast<size_t>(x)]) * channels;
        const float wx = xs.weight[static_cast<size_t>(x)];
        const float t = top[lo] + (top[hi] - top[lo]) * wx;
        const float u = bottom[lo] + (bottom[hi] - bottom[lo]) * wx;
        dst[static_cast<size_t>(y) * width + x] = (t + (u - t) * wy) * a + b;
      }
    }
  }
}

Batch ImageFolderDataset::build(const std::vector<int64_t>& indices, bool augment,
                                uint64_t draw) const {
  const auto n = static_cast<int64_t>(indices.size());
  std::vector<int64_t> shape{n};
  shape.insert(shape.end(), options_.sample_shape().begin(), options_.sample_shape().end());
  Batch batch;
  batch.inputs = {at::empty(shape, at::TensorOptions().dtype(at::kFloat))};
  batch.target = at::empty({n}, at::TensorOptions().dtype(at::kLong));
  float* inputs = batch.inputs[0].data_ptr<float>();
  int64_t* targets = batch.target.data_ptr<int64_t>();
  const int64_t sample = batch.inputs[0].numel() / std::max<int64_t>(n, 1);
  for (int64_t i = 0; i < n; ++i) {
    int64_t index = indices[static_cast<size_t>(i)];
    TORCH_CHECK(index >= 0 && index < size(), "ImageFolderDataset: index ", index,
                " out of range [0, ", size(), ")");
    // A bad file: the error names it, or the next readable sample stands in.
    for (int64_t tried = 0;; ++tried) {
      try {
        load(index, augment, draw, inputs + i * sample);
        targets[i] = label(index);
        break;
      } catch (const Error& e) {
        if (!options_.skip_bad_samples()) throw;
        bool first = false;
        {
          std::lock_guard<std::mutex> lock(skipped_mutex_);
          first = skipped_.insert(path(index)).second;
        }
        if (first) std::fprintf(stderr, "warning: skipped: %s\n", first_line(e.what()).c_str());
        if (tried + 1 >= size()) {
          throw OptionError(Option::kData, "imagefolder:" + dir_,
                            "no readable image in the folder");
        }
        index = (index + 1) % size();
      }
    }
  }
  return batch;
}

Batch ImageFolderDataset::get_batch(const std::vector<int64_t>& indices) const {
  return build(indices, /*augment=*/false, 0);
}

Batch ImageFolderDataset::draw_batch(const std::vector<int64_t>& indices, uint64_t draw) const {
  return build(indices, /*augment=*/true, draw);
}

int64_t ImageFolderDataset::skipped_samples() const {
  std::lock_guard<std::mutex> lock(skipped_mutex_);
  return static_cast<int64_t>(skipped_.size());
}

std::vector<std::string> ImageFolderDataset::skipped_files() const {
  std::lock_guard<std::mutex> lock(skipped_mutex_);
  return {skipped_.begin(), skipped_.end()};
}

std::vector<std::string> ImageFolderDataset::unreadable_classes() const {
  std::vector<int64_t> readable(class_names_.size(), 0);
  {
    std::lock_guard<std::mutex> lock(skipped_mutex_);
    for (size_t i = 0; i < files_.size(); ++i) {
      if (skipped_.count(files_[i]) == 0) ++readable[static_cast<size_t>(labels_[i])];
    }
  }
  std::vector<std::string> classes;
  for (size_t c = 0; c < class_names_.size(); ++c) {
    if (readable[c] == 0) classes.push_back(class_names_[c]);
  }
  return classes;
}

std::string ImageFolderDataset::describe() const {
  std::string names;
  for (size_t i = 0; i < class_names_.size() && i < 5; ++i) {
    names += (i > 0 ? ", " : "") + class_names_[i];
  }
  if (class_names_.size() > 5) names += ", ...";
  return fmt::format("imagefolder {} ({} samples, {}, {} classes: {})", dir_, size(),
                     format_shape(sample_shape()), classes(), names);
}

}  // namespace batchtune
