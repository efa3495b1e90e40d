#pragma once

// Small helpers several tests share.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <memory>
#include <string>
#include <vector>

#include "batchtune/data/dataset.h"
#include "batchtune/common/error.h"

namespace batchtune::testing {

/// A learnable toy problem: labels are the argmax of a fixed linear map of
/// the inputs, so a few steps of training beat chance.
inline std::unique_ptr<TensorDataset> toy_data(std::vector<int64_t> shape, int64_t samples,
                                               int64_t classes, uint64_t seed) {
  auto map_generator = at::make_generator<at::CPUGeneratorImpl>(99);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<int64_t> sizes{samples};
  sizes.insert(sizes.end(), shape.begin(), shape.end());
  int64_t features = 1;
  for (int64_t d : shape) features *= d;
  const at::Tensor map = at::randn({features, classes}, map_generator);  // one problem
  const at::Tensor inputs = at::randn(sizes, generator);
  const at::Tensor targets = inputs.reshape({samples, -1}).matmul(map).argmax(1);
  return std::make_unique<TensorDataset>("toy", inputs, targets, classes);
}

/// Detached clones: a snapshot to compare against later.
inline std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.detach().clone());
  return out;
}

/// Every tensor equal, bit for bit.
inline void expect_identical(const std::vector<torch::Tensor>& a,
                             const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i;
}

/// One intra-op thread for the scope, for tests that compare two runs of the
/// same arithmetic bit for bit: with two threads on a loaded 2-core machine,
/// two identical MLP steps differed in the last bits of their gradients in 3
/// of 60 runs (MKL_DYNAMIC=FALSE did not help); with one, in none of 60.
class OneThread {
 public:
  OneThread() : previous_(at::get_num_threads()) { at::set_num_threads(1); }
  ~OneThread() { at::set_num_threads(previous_); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int previous_;
};

/// The message of the `batchtune::Error` that `f` throws ("" if none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace batchtune::testing
