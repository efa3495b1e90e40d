#include "batchtune/data/dataset.h"
#include "batchtune/data/text.h"

#include "batchtune/memory/budget_allocator.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "batchtune/data/fashion_mnist.h"
#include "batchtune/data/image_folder.h"
#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/common/shape.h"

namespace batchtune {
namespace {

at::Tensor index_tensor(const std::vector<int64_t>& indices, int64_t size) {
  for (int64_t i : indices) {
    TORCH_CHECK(i >= 0 && i < size, "Dataset::get_batch: index ", i, " out of range [0, ", size,
                ")");
  }
  return at::tensor(indices, at::TensorOptions().dtype(at::kLong));
}

}  // namespace

TensorDataset::TensorDataset(std::string name, at::Tensor inputs, at::Tensor targets,
                             int64_t classes, Normalization normalization)
    : name_(std::move(name)),
      inputs_(std::move(inputs)),
      targets_(std::move(targets)),
      classes_(classes),
      normalization_(normalization) {
  TORCH_CHECK(inputs_.dim() >= 1 && targets_.dim() == 1 && inputs_.size(0) == targets_.size(0),
              "TensorDataset: inputs [N, ...] and targets [N] must have the same N");
  // Converted and normalised once, not per batch: the training loop then
  // only gathers rows, as a hand-written loop over an in-memory set does.
  // Host data, not the emulated device's: outside the CPU budget.
  BudgetAllocator::UncountedScope uncounted;
  inputs_ = inputs_.to(at::kFloat);
  const auto& n = normalization_;
  if (n.scale != 1.0 || n.mean != 0.0 || n.std != 1.0) {
    inputs_.mul_(n.scale / n.std).sub_(n.mean / n.std);
  }
  targets_ = targets_.to(at::kLong);
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  const at::Tensor index = index_tensor(indices, size());
  Batch batch;
  batch.inputs = {inputs_.index_select(0, index)};
  batch.target = targets_.index_select(0, index);
  return batch;
}

std::vector<int64_t> TensorDataset::sample_shape() const {
  const auto sizes = inputs_.sizes();
  return {sizes.begin() + 1, sizes.end()};
}

std::string TensorDataset::describe() const {
  return fmt::format("{} ({} samples, {}, {} classes)", name_, size(),
                     format_shape(sample_shape()), classes_);
}

SyntheticDataset::SyntheticDataset(std::vector<int64_t> sample_shape, int64_t classes,
                                   int64_t size, uint64_t seed)
    : shape_(std::move(sample_shape)), classes_(classes), size_(size), seed_(seed) {
  TORCH_CHECK(size_ > 0 && classes_ >= 2, "SyntheticDataset: need samples and 2+ classes");
  // The pool is the data set's storage, made once: host memory outside the
  // emulated device budget, as a real data set's files are.
  BudgetAllocator::UncountedScope uncounted;
  const int64_t pool = std::min(size_, kSyntheticPoolSize);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed_ * 1000003 + 17);
  std::vector<int64_t> shape{pool};
  shape.insert(shape.end(), shape_.begin(), shape_.end());
  pool_inputs_ = at::randn(shape, generator, at::TensorOptions().dtype(at::kFloat));
  // Labels from a fixed random linear map of the inputs: learnable, so a
  // training run on synthetic data has a gradient signal (and a noise scale)
  // as real data do.
  int64_t features = 1;
  for (int64_t d : shape_) features *= d;
  const at::Tensor map = at::randn({features, classes_}, generator);
  pool_targets_ = pool_inputs_.reshape({pool, features}).matmul(map).argmax(1);
}

Batch SyntheticDataset::get_batch(const std::vector<int64_t>& indices) const {
  const int64_t pool = pool_targets_.size(0);
  std::vector<int64_t> rows(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    TORCH_CHECK(indices[i] >= 0 && indices[i] < size_, "SyntheticDataset: index ", indices[i],
                " out of range");
    // Sample i is pool row i mod the pool: the same in whatever batch.
    rows[i] = indices[i] % pool;
  }
  at::Tensor index;
  {
    BudgetAllocator::UncountedScope uncounted;  // bookkeeping, not data
    index = at::tensor(rows, at::TensorOptions().dtype(at::kLong));
  }
  Batch batch;
  batch.inputs = {pool_inputs_.index_select(0, index)};
  batch.target = pool_targets_.index_select(0, index);
  return batch;
}

std::string SyntheticDataset::describe() const {
  return fmt::format("synthetic ({} samples, {}, {} classes, labels a linear map of the inputs)", size_,
                     format_shape(shape_), classes_);
}

DataSplits open_dataset(const std::string& spec, const std::vector<int64_t>& synthetic_shape,
                        int64_t synthetic_classes, uint64_t seed, DataOptions options) {
  DataSplits splits;
  if (spec.empty() || spec == "synthetic") {
    splits.train = std::make_unique<SyntheticDataset>(synthetic_shape, synthetic_classes,
                                                      kDefaultSyntheticSize, seed);
    return splits;
  }
  const std::string name = spec.substr(0, spec.find(':'));
  if (name == "fashion-mnist") {
    const std::string dir =
        spec.size() > name.size() ? spec.substr(name.size() + 1) : kFashionMnistDefaultDir;
    if (dir.empty()) {
      throw OptionError(Option::kData, "fashion-mnist", "give a directory after ':' or none");
    }
    splits.train = load_fashion_mnist(dir, FashionMnistSplit::kTrain);
    splits.test = load_fashion_mnist(dir, FashionMnistSplit::kTest);
    return splits;
  }
  if (name == "imagefolder") {
    const std::string dir = spec.size() > name.size() ? spec.substr(name.size() + 1) : "";
    if (dir.empty()) {
      throw OptionError(Option::kData, "imagefolder",
                        "give the directory, as imagefolder:DIR (one sub-folder per class)");
    }
    splits.train = std::make_unique<ImageFolderDataset>(
        dir, ImageFolderOptions()
                 .sample_shape(synthetic_shape)
                 .seed(seed)
                 .skip_bad_samples(options.skip_bad_samples()));
    return splits;
  }
  if (name == "text") {
    const std::string dir = spec.size() > name.size() ? spec.substr(name.size() + 1) : "";
    if (dir.empty()) {
      throw OptionError(Option::kData, "text",
                        "give the directory, as text:DIR (each file a document)");
    }
    if (synthetic_shape.size() != 1) {
      throw OptionError(Option::kData, "text:" + dir,
                        "text is a sequence of byte tokens; give " + mention(Option::kInput) +
                            " int64:MIN..MAX, like int64:16..512");
    }
    splits.train = std::make_unique<TextDataset>(
        dir, LengthRange{std::min(options.min_length(), synthetic_shape.front()),
                         synthetic_shape.front()});
    return splits;
  }
  throw OptionError(Option::kData, fmt::format("unknown data '{}'; use synthetic, "
                                                "fashion-mnist[:DIR], imagefolder:DIR or text:DIR",
                                                spec));
}

}  // namespace batchtune
