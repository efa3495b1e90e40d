#pragma once

// The built-in networks, each in the file named after it; model_zoo.cpp
// names them.

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>

#include "batchtune/models/model.h"

namespace batchtune::models {

/// A torch::nn module and its forward. (AnyModule cannot hold a Sequential,
/// whose forward is a template.)
struct BuiltModule {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor&)> forward;
  /// FLOPs of one sample's forward pass, counted from the architecture
  /// (convolutions, linear layers and attention; a multiply-add is 2).
  double forward_flops = 0;
};

template <typename Holder>
BuiltModule built(Holder holder, double forward_flops) {
  return {holder.ptr(), [holder](const at::Tensor& x) mutable { return holder->forward(x); },
          forward_flops};
}

/// FLOPs of a convolution's forward pass over an output of out_h x out_w.
inline double conv_flops(int64_t in, int64_t out, int64_t kernel, int64_t out_h, int64_t out_w) {
  return 2.0 * static_cast<double>(in * kernel * kernel * out * out_h * out_w);
}
/// FLOPs of a linear layer's forward pass for one row.
inline double linear_flops(int64_t in, int64_t out) { return 2.0 * static_cast<double>(in * out); }

/// The guide's network: Conv2d(C->64, k=3), ReLU, global average pool, linear.
BuiltModule make_convnet(const ModelSpec& spec);
/// Flatten, one hidden layer with ReLU, linear.
BuiltModule make_mlp(const ModelSpec& spec);
/// LeNet-5: two convolution + max-pool stages, then two linear layers.
BuiltModule make_lenet(const ModelSpec& spec);
/// ResNet-18 (He et al. 2016): basic blocks [2, 2, 2, 2], 64-512 channels.
BuiltModule make_resnet18(const ModelSpec& spec);
/// A small decoder-only transformer over token ids: [B, T] -> logits [B, T, vocab].
BuiltModule make_gpt(const ModelSpec& spec);

}  // namespace batchtune::models
