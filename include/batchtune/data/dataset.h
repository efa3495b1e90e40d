#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "batchtune/data/batch.h"

namespace batchtune {

/// A source of labelled samples that the training loop draws batches from
/// by index. Batches come back in host memory; the loop moves them to the
/// device. Implementations: `TensorDataset` (samples held in memory, e.g.
/// Fashion-MNIST), `SyntheticDataset`, `ImageFolderDataset`. `get_batch`
/// and `draw_batch` may be called from several threads at once (the
/// `Loader`'s workers).
class Dataset {
 public:
  virtual ~Dataset() = default;
  /// Number of samples.
  virtual int64_t size() const = 0;
  /// The samples at `indices`, in that order, as one batch.
  virtual Batch get_batch(const std::vector<int64_t>& indices) const = 0;
  /// The samples at `indices` for training: with random augmentation (crop,
  /// flip) drawn from `draw` and the index alone, so a batch is the same
  /// whichever thread builds it. Data without augmentation return
  /// `get_batch(indices)`.
  virtual Batch draw_batch(const std::vector<int64_t>& indices, uint64_t draw) const {
    (void)draw;
    return get_batch(indices);
  }
  /// Unreadable files skipped so far (`--skip-bad-samples`); 0 where there
  /// are no files.
  virtual int64_t skipped_samples() const { return 0; }
  /// Classes every one of whose samples was skipped so far: the model never
  /// saw them, which a run must not pass over in silence.
  virtual std::vector<std::string> unreadable_classes() const { return {}; }
  /// Made-up samples, costing nothing to load: no input pipeline to tune.
  virtual bool synthetic() const { return false; }
  /// Per-sample input shape (no batch dimension).
  virtual std::vector<int64_t> sample_shape() const = 0;
  virtual int64_t classes() const = 0;
  /// For logs: "fashion-mnist train (60000 samples, 1x28x28, 10 classes)".
  virtual std::string describe() const = 0;
};

/// How `TensorDataset` turns stored samples into model inputs:
/// `(x × scale − mean) / std`, in float.
struct Normalization {
  double scale = 1.0;
  double mean = 0.0;
  double std = 1.0;
};

/// Samples held in memory: `inputs` [N, ...] of any dtype, converted once to
/// float as `(x × scale − mean) / std` (host memory, outside the CPU budget);
/// `targets` [N] int64.
///
/// Example:
/// ```
///   batchtune::TensorDataset data("toy", images_u8, labels, 10,
///                                 batchtune::Normalization{1.0 / 255, 0.2860, 0.3530});
///   batchtune::Batch b = data.get_batch({0, 5, 7});
/// ```
class TensorDataset final : public Dataset {
 public:
  TensorDataset(std::string name, at::Tensor inputs, at::Tensor targets, int64_t classes,
                Normalization normalization = {});

  int64_t size() const override { return inputs_.size(0); }
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  std::vector<int64_t> sample_shape() const override;
  int64_t classes() const override { return classes_; }
  std::string describe() const override;

 private:
  std::string name_;
  at::Tensor inputs_;
  at::Tensor targets_;
  int64_t classes_;
  Normalization normalization_;
};

/// Random inputs (standard normal) labelled by a fixed random linear map of
/// them (learnable, like real data), the same for the same
/// seed and index whatever batch the sample lands in: tuning and smoke runs
/// that need no files. The samples come from a seeded pool of at most
/// `kSyntheticPoolSize` made once (sample i is pool row i mod its size), so
/// that a batch costs a gather, not random numbers: training on synthetic
/// data runs at the model's speed.
class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(std::vector<int64_t> sample_shape, int64_t classes, int64_t size,
                   uint64_t seed);

  int64_t size() const override { return size_; }
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  std::vector<int64_t> sample_shape() const override { return shape_; }
  int64_t classes() const override { return classes_; }
  std::string describe() const override;
  bool synthetic() const override { return true; }

 private:
  std::vector<int64_t> shape_;
  int64_t classes_;
  int64_t size_;
  uint64_t seed_;
  at::Tensor pool_inputs_;
  at::Tensor pool_targets_;
};

/// Distinct samples a `SyntheticDataset` holds: enough that batches differ,
/// few enough to make at once (12 MiB for 3x64x64).
constexpr int64_t kSyntheticPoolSize = 256;

/// Samples of the synthetic training set when no size is given: enough for
/// several hundred steps per epoch at common batch sizes.
constexpr int64_t kDefaultSyntheticSize = 16384;

/// A training split and, where the data has one, a held-out test split.
struct DataSplits {
  std::unique_ptr<Dataset> train;
  std::unique_ptr<Dataset> test;  ///< null without a test split
};

/// How `open_dataset` reads files.
struct DataOptions {
  /// Unreadable image files are skipped with a warning (and counted) instead
  /// of stopping the run with an error naming them.
  TORCH_ARG(bool, skip_bad_samples) = false;
  /// `text:DIR`: the shortest sample in tokens (the longest is the shape's).
  TORCH_ARG(int64_t, min_length) = 1;
};

/// Opens the data named by `--data`: `synthetic` (the default; the shape
/// and classes given), `fashion-mnist[:DIR]`, `imagefolder:DIR` (images
/// made to the shape given, one class per sub-folder) or `text:DIR`
/// (`TextDataset`: byte tokens, at most the shape's one dimension long). Throws
/// `batchtune::Error` naming `--data` or the file at fault.
DataSplits open_dataset(const std::string& spec, const std::vector<int64_t>& synthetic_shape,
                        int64_t synthetic_classes, uint64_t seed, DataOptions options = {});

}  // namespace batchtune
