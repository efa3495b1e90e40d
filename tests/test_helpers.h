#pragma once

// Small helpers several tests share.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "batchtune/error.h"

namespace batchtune::testing {

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
