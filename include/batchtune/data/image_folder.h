#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "batchtune/data/dataset.h"

namespace batchtune {

/// The resized image is this much larger than the crop taken from it
/// (256 / 224, torchvision's ImageNet recipe): room for the random crop.
constexpr double kImageResizeRatio = 256.0 / 224.0;

/// Per-channel mean and standard deviation of ImageNet's pixels in [0, 1]
/// (RGB), and their averages for gray images: inputs are normalised with
/// them, as pretrained vision models expect.
constexpr double kImageNetMean[3] = {0.485, 0.456, 0.406};
constexpr double kImageNetStd[3] = {0.229, 0.224, 0.225};
constexpr double kGrayMean = 0.449;
constexpr double kGrayStd = 0.226;

struct ImageFolderOptions {
  /// Samples as C×H×W: C 1 (gray) or 3 (RGB), any H and W.
  TORCH_ARG(std::vector<int64_t>, sample_shape) = std::vector<int64_t>{3, 64, 64};
  /// Seeds the augmentation together with each batch's draw.
  TORCH_ARG(uint64_t, seed) = 0;
  /// Unreadable files are skipped with a warning (each once, counted), and
  /// the next readable sample stands in; otherwise they are an error.
  TORCH_ARG(bool, skip_bad_samples) = false;
};

/// Images in one sub-folder per class (`DIR/cat/1.jpg`, `DIR/dog/x.png`):
/// classes are the sub-folders in name order, samples their `.jpg`,
/// `.jpeg` and `.png` files. Each sample is read and decoded when a batch
/// needs it (JPEG with libjpeg-turbo, PNG with stb), scaled so the C×H×W
/// output fits `kImageResizeRatio` times over, cropped to H×W, flipped, and
/// normalised per channel: `draw_batch` crops at random and flips half of the
/// samples, `get_batch` takes the centre crop unflipped. Safe to call from
/// several threads.
///
/// Example:
/// ```
///   batchtune::ImageFolderDataset data(
///       "/data/pets", batchtune::ImageFolderOptions().sample_shape({3, 64, 64}));
///   batchtune::Batch b = data.draw_batch({0, 7, 3}, /*draw=*/1);  // [3, 3, 64, 64]
/// ```
class ImageFolderDataset final : public Dataset {
 public:
  /// Lists the folder; throws `batchtune::Error` naming it when it is
  /// missing, has fewer than two class folders, or a class has no images.
  ImageFolderDataset(std::string dir, ImageFolderOptions options);

  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  Batch draw_batch(const std::vector<int64_t>& indices, uint64_t draw) const override;
  std::vector<int64_t> sample_shape() const override { return options_.sample_shape(); }
  int64_t classes() const override { return static_cast<int64_t>(class_names_.size()); }
  std::string describe() const override;
  int64_t skipped_samples() const override;

  const std::vector<std::string>& class_names() const { return class_names_; }
  /// The file of sample `index`, and its class.
  const std::string& path(int64_t index) const { return files_.at(static_cast<size_t>(index)); }
  int64_t label(int64_t index) const { return labels_.at(static_cast<size_t>(index)); }
  /// The files skipped so far, in name order.
  std::vector<std::string> skipped_files() const;
  std::vector<std::string> unreadable_classes() const override;

 private:
  Batch build(const std::vector<int64_t>& indices, bool augment, uint64_t draw) const;
  /// Decodes sample `index` into `out` (C×H×W floats); throws naming the file.
  void load(int64_t index, bool augment, uint64_t draw, float* out) const;

  std::string dir_;
  ImageFolderOptions options_;
  std::vector<std::string> class_names_;
  std::vector<std::string> files_;
  std::vector<int64_t> labels_;
  mutable std::mutex skipped_mutex_;
  mutable std::set<std::string> skipped_;
};

}  // namespace batchtune
