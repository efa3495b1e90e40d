#include "batchtune/datasets/fashion_mnist.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <memory>

#include "batchtune/budget_allocator.h"
#include "batchtune/error.h"

#ifdef BATCHTUNE_HAVE_ZLIB
#include <zlib.h>
#endif

namespace batchtune {
namespace {

constexpr uint32_t kImagesMagic = 2051;  // IDX: unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 2049;  // IDX: unsigned bytes, 1 dimension
constexpr int64_t kSide = 28;
constexpr int64_t kClasses = 10;
constexpr int64_t kTrainSamples = 60000;
constexpr int64_t kTestSamples = 10000;

bool exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

/// Reads a whole file, gzip-compressed or not.
class FileReader {
 public:
  explicit FileReader(std::string path) : path_(std::move(path)) {
#ifdef BATCHTUNE_HAVE_ZLIB
    file_ = gzopen(path_.c_str(), "rb");  // reads plain files as they are
#else
    if (path_.size() > 3 && path_.compare(path_.size() - 3, 3, ".gz") == 0) {
      throw Error(fmt::format("{}: this batchtune was built without zlib; gunzip the files "
                              "in that directory, or rebuild with zlib",
                              path_));
    }
    file_ = std::fopen(path_.c_str(), "rb");
#endif
    if (file_ == nullptr) throw Error(fmt::format("{}: cannot open the file", path_));
  }
  ~FileReader() {
#ifdef BATCHTUNE_HAVE_ZLIB
    gzclose(file_);
#else
    std::fclose(file_);
#endif
  }
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  /// Reads exactly `bytes` or throws naming the file.
  void read(void* out, size_t bytes, const char* what) {
#ifdef BATCHTUNE_HAVE_ZLIB
    size_t done = 0;
    while (done < bytes) {
      const int n = gzread(file_, static_cast<char*>(out) + done,
                           static_cast<unsigned>(std::min<size_t>(bytes - done, 1 << 30)));
      if (n < 0) {
        int code = 0;
        throw Error(fmt::format("{}: corrupt or not gzip ({})", path_, gzerror(file_, &code)));
      }
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
#else
    const size_t done = std::fread(out, 1, bytes, file_);
#endif
    if (done != bytes) {
      throw Error(fmt::format("{}: truncated: {} ended after {} of {} bytes; reinstall "
                              "dataset-fashion-mnist or fetch the file again",
                              path_, what, done, bytes));
    }
  }

  uint32_t read_u32(const char* what) {
    std::array<unsigned char, 4> b{};
    read(b.data(), b.size(), what);
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
#ifdef BATCHTUNE_HAVE_ZLIB
  gzFile file_ = nullptr;
#else
  FILE* file_ = nullptr;
#endif
};

std::string find_file(const std::string& dir, const std::string& name) {
  for (const std::string& candidate : {dir + "/" + name + ".gz", dir + "/" + name}) {
    if (exists(candidate)) return candidate;
  }
  throw Error(fmt::format("--data fashion-mnist:{}: {}/{}[.gz] not found; install Debian's "
                          "dataset-fashion-mnist or give the directory that holds the IDX files",
                          dir, dir, name));
}

void expect(FileReader& file, uint32_t value, uint32_t wanted, const char* field) {
  if (value != wanted) {
    throw Error(fmt::format("{}: not a Fashion-MNIST IDX file: {} is {}, expected {}",
                            file.path(), field, value, wanted));
  }
}

}  // namespace

std::unique_ptr<TensorDataset> load_fashion_mnist(const std::string& dir,
                                                  FashionMnistSplit split) {
  const bool train = split == FashionMnistSplit::kTrain;
  const std::string prefix = train ? "train" : "t10k";
  const int64_t samples = train ? kTrainSamples : kTestSamples;
  // The data set lives in host memory: it is not the emulated device's.
  BudgetAllocator::UncountedScope uncounted;

  FileReader images(find_file(dir, prefix + "-images-idx3-ubyte"));
  expect(images, images.read_u32("the header"), kImagesMagic, "the magic number");
  expect(images, images.read_u32("the header"), static_cast<uint32_t>(samples),
         "the image count");
  expect(images, images.read_u32("the header"), kSide, "the row count");
  expect(images, images.read_u32("the header"), kSide, "the column count");
  at::Tensor pixels = at::empty({samples, 1, kSide, kSide}, at::TensorOptions().dtype(at::kByte));
  images.read(pixels.data_ptr<uint8_t>(), static_cast<size_t>(pixels.numel()), "the pixels");

  FileReader labels(find_file(dir, prefix + "-labels-idx1-ubyte"));
  expect(labels, labels.read_u32("the header"), kLabelsMagic, "the magic number");
  expect(labels, labels.read_u32("the header"), static_cast<uint32_t>(samples),
         "the label count");
  at::Tensor classes = at::empty({samples}, at::TensorOptions().dtype(at::kByte));
  labels.read(classes.data_ptr<uint8_t>(), static_cast<size_t>(samples), "the labels");
  if (classes.max().item<int64_t>() >= kClasses) {
    throw Error(fmt::format("{}: a label is {}, above the 10 classes", labels.path(),
                            classes.max().item<int64_t>()));
  }
  return std::make_unique<TensorDataset>(
      "fashion-mnist " + std::string(train ? "train" : "test"), pixels, classes.to(at::kLong),
      kClasses, Normalization{1.0 / 255.0, kFashionMnistMean, kFashionMnistStd});
}

}  // namespace batchtune
