#include <torch/nn/functional/activation.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include "batchtune/models/activation_checkpoint.h"
#include "models/builtin_models.h"

namespace batchtune::models {
namespace {

namespace nn = torch::nn;

nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return nn::Conv2d(
      nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

/// Two 3x3 convolutions with a shortcut; a 1x1 convolution on the shortcut
/// where the block changes the width or the stride.
struct BasicBlockImpl : nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(register_module("conv1", conv(in, out, 3, stride))),
        bn1(register_module("bn1", nn::BatchNorm2d(out))),
        conv2(register_module("conv2", conv(out, out, 3, 1))),
        bn2(register_module("bn2", nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      downsample = register_module(
          "downsample", nn::Sequential(conv(in, out, 1, stride), nn::BatchNorm2d(out)));
    }
  }

  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = torch::relu(bn1(conv1(x)));
    y = bn2(conv2(y));
    return torch::relu(y + (downsample.is_empty() ? x : downsample->forward(x)));
  }

  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
  nn::Sequential downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

constexpr int64_t kWidths[] = {64, 128, 256, 512};
constexpr int64_t kBlocksPerStage = 2;

struct ResNet18Impl : nn::Module {
  ResNet18Impl(int64_t channels, int64_t classes, bool checkpointing)
      : checkpointing(checkpointing),
        stem(register_module("stem", nn::Sequential(conv(channels, kWidths[0], 7, 2),
                                                    nn::BatchNorm2d(kWidths[0]), nn::ReLU(),
                                                    nn::MaxPool2d(nn::MaxPool2dOptions(3)
                                                                      .stride(2)
                                                                      .padding(1))))),
        fc(register_module("fc", nn::Linear(kWidths[3], classes))) {
    int64_t in = kWidths[0];
    for (size_t stage = 0; stage < 4; ++stage) {
      for (int64_t block = 0; block < kBlocksPerStage; ++block) {
        const int64_t stride = (stage > 0 && block == 0) ? 2 : 1;
        layers->push_back(BasicBlock(in, kWidths[stage], stride));
        in = kWidths[stage];
      }
    }
    register_module("layers", layers);
  }

  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = stem->forward(x);
    for (const auto& module : layers->children()) {
      auto* block = module->as<BasicBlock>();
      // The recomputation's batch norms would count the batch in their
      // running statistics a second time: it leaves them as the forward did.
      y = checkpointing && is_training()
              ? checkpointed([block](const at::Tensor& in) { return block->forward(in); }, y,
                             block->buffers())
              : block->forward(y);
    }
    return fc(torch::adaptive_avg_pool2d(y, {1, 1}).flatten(1));
  }

  bool checkpointing;
  nn::Sequential stem;
  nn::Sequential layers;
  nn::Linear fc;
};
TORCH_MODULE(ResNet18);

/// Walks the architecture above, side lengths and all.
double resnet18_flops(const ModelSpec& spec) {
  const auto conv_side = [](int64_t side, int64_t kernel, int64_t stride) {
    return (side + 2 * (kernel / 2) - kernel) / stride + 1;
  };
  int64_t h = conv_side(spec.input_shape[1], 7, 2);
  int64_t w = conv_side(spec.input_shape[2], 7, 2);
  double flops = conv_flops(spec.input_shape[0], kWidths[0], 7, h, w);
  h = (h + 2 - 3) / 2 + 1;  // max pool 3, stride 2, padding 1
  w = (w + 2 - 3) / 2 + 1;
  int64_t in = kWidths[0];
  for (size_t stage = 0; stage < 4; ++stage) {
    for (int64_t block = 0; block < kBlocksPerStage; ++block) {
      const int64_t stride = (stage > 0 && block == 0) ? 2 : 1;
      const int64_t out = kWidths[stage];
      h = conv_side(h, 3, stride);
      w = conv_side(w, 3, stride);
      flops += conv_flops(in, out, 3, h, w) + conv_flops(out, out, 3, h, w);
      if (stride != 1 || in != out) flops += conv_flops(in, out, 1, h, w);
      in = out;
    }
  }
  return flops + linear_flops(kWidths[3], spec.classes);
}

}  // namespace

BuiltModule make_resnet18(const ModelSpec& spec) {
  return built(ResNet18(spec.input_shape.front(), spec.classes, spec.checkpointing),
               resnet18_flops(spec));
}

}  // namespace batchtune::models
