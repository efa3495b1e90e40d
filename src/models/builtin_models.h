#pragma once

// The built-in networks, each in the file named after it; model_zoo.cpp
// names them.

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>

#include "batchtune/model.h"

namespace batchtune::models {

/// A torch::nn module and its forward. (AnyModule cannot hold a Sequential,
/// whose forward is a template.)
struct BuiltModule {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor&)> forward;
};

template <typename Holder>
BuiltModule built(Holder holder) {
  return {holder.ptr(), [holder](const at::Tensor& x) mutable { return holder->forward(x); }};
}

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
