#include "batchtune/data/fashion_mnist.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <memory>
#include <vector>

#include "batchtune/memory/budget_allocator.h"
#include "batchtune/data/idx_file.h"
#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/common/shape.h"

namespace batchtune {
namespace {

constexpr int64_t kSide = 28;
constexpr int64_t kClasses = 10;
constexpr int64_t kTrainSamples = 60000;
constexpr int64_t kTestSamples = 10000;

bool exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string find_file(const std::string& dir, const std::string& name) {
  for (const std::string& candidate : {dir + "/" + name + ".gz", dir + "/" + name}) {
    if (exists(candidate)) return candidate;
  }
  throw OptionError(Option::kData, "fashion-mnist:" + dir,
                    fmt::format("{}/{}[.gz] not found; install Debian's dataset-fashion-mnist or "
                                "give the directory that holds the IDX files",
                                dir, name));
}

/// `tensor` (read from `path`) must have `sizes`.
void expect_sizes(const at::Tensor& tensor, const std::vector<int64_t>& sizes,
                  const std::string& path) {
  if (tensor.sizes() != at::IntArrayRef(sizes)) {
    throw Error(fmt::format("{}: not a Fashion-MNIST file: its data is {}, expected {}; give the "
                            "directory of the Fashion-MNIST IDX files",
                            path, format_shape(tensor.sizes().vec()), format_shape(sizes)));
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

  const std::string images_path = find_file(dir, prefix + "-images-idx3-ubyte");
  at::Tensor pixels = read_idx(images_path);
  expect_sizes(pixels, {samples, kSide, kSide}, images_path);
  pixels = pixels.unsqueeze(1);  // one channel

  const std::string labels_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  const at::Tensor classes = read_idx(labels_path);
  expect_sizes(classes, {samples}, labels_path);
  if (classes.max().item<int64_t>() >= kClasses) {
    throw Error(fmt::format("{}: a label is {}, above the 10 classes", labels_path,
                            classes.max().item<int64_t>()));
  }
  return std::make_unique<TensorDataset>(
      "fashion-mnist " + std::string(train ? "train" : "test"), pixels, classes.to(at::kLong),
      kClasses, Normalization{1.0 / 255.0, kFashionMnistMean, kFashionMnistStd});
}

}  // namespace batchtune
