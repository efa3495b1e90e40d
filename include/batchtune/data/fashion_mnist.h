#pragma once

#include <memory>
#include <string>

#include "batchtune/data/dataset.h"

namespace batchtune {

/// Where Debian's `dataset-fashion-mnist` package puts the files.
constexpr const char* kFashionMnistDefaultDir = "/usr/share/datasets/fashion-mnist";

/// Mean and standard deviation of Fashion-MNIST's training pixels (in
/// [0, 1]): inputs are normalised with them.
constexpr double kFashionMnistMean = 0.2860;
constexpr double kFashionMnistStd = 0.3530;

enum class FashionMnistSplit { kTrain, kTest };

/// Reads one split of Fashion-MNIST from `dir`: the IDX files
/// `train-images-idx3-ubyte` / `train-labels-idx1-ubyte` (60000 samples) or
/// `t10k-*` (10000), gzip-compressed (`.gz`, as Debian ships them) or not.
/// Samples are 1x28x28 images in 10 classes, normalised. The bytes are
/// kept in host memory outside the CPU budget's count (they are the data
/// set, not the device's). Missing, malformed or truncated files throw
/// `batchtune::Error` naming the file.
///
/// Example:
/// ```
///   auto train = batchtune::load_fashion_mnist(batchtune::kFashionMnistDefaultDir,
///                                              batchtune::FashionMnistSplit::kTrain);
///   auto batch = train->get_batch({0, 1, 2});  // input [3, 1, 28, 28]
/// ```
std::unique_ptr<TensorDataset> load_fashion_mnist(const std::string& dir,
                                                  FashionMnistSplit split);

}  // namespace batchtune
