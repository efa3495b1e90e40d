#include <fmt/format.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "models/builtin_models.h"

namespace batchtune::models {

// LeNet-5's widths (LeCun et al. 1998), the first convolution padded so that
// 28x28 inputs keep LeNet's original 32x32 geometry.
constexpr int64_t kConv1Channels = 6;
constexpr int64_t kConv2Channels = 16;
constexpr int64_t kKernel = 5;
constexpr int64_t kHidden = 120;

BuiltModule make_lenet(const ModelSpec& spec) {
  namespace nn = torch::nn;
  if (spec.input_shape.size() != 3) {
    throw OptionError(Option::kInput, "lenet needs an image shape CxHxW, like 1x28x28");
  }
  // conv(pad 2) keeps the side, pool halves it, conv(no pad) takes 4, pool halves.
  const auto side = [](int64_t s) { return (s / 2 - (kKernel - 1)) / 2; };
  const int64_t h = side(spec.input_shape[1]);
  const int64_t w = side(spec.input_shape[2]);
  if (h < 1 || w < 1) {
    throw OptionError(Option::kInput, fmt::format("lenet needs images of at least 12x12, got {}x{}",
                                                  spec.input_shape[1], spec.input_shape[2]));
  }
  const int64_t c = spec.input_shape[0];
  const int64_t h1 = spec.input_shape[1];
  const int64_t w1 = spec.input_shape[2];
  const double flops = conv_flops(c, kConv1Channels, kKernel, h1, w1) +
                       conv_flops(kConv1Channels, kConv2Channels, kKernel, h1 / 2 - (kKernel - 1),
                                  w1 / 2 - (kKernel - 1)) +
                       linear_flops(kConv2Channels * h * w, kHidden) +
                       linear_flops(kHidden, spec.classes);
  return built(nn::Sequential(
      nn::Conv2d(nn::Conv2dOptions(c, kConv1Channels, kKernel).padding(2)),
      nn::ReLU(), nn::MaxPool2d(2),
      nn::Conv2d(nn::Conv2dOptions(kConv1Channels, kConv2Channels, kKernel)), nn::ReLU(),
      nn::MaxPool2d(2), nn::Flatten(), nn::Linear(kConv2Channels * h * w, kHidden),
      nn::ReLU(), nn::Linear(kHidden, spec.classes)), flops);
}

}  // namespace batchtune::models
