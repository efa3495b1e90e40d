#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include "models/builtin_models.h"

namespace batchtune::models {

// Exactly the network of the guide batchtune comes from.
constexpr int64_t kConvnetChannels = 64;

BuiltModule make_convnet(const ModelSpec& spec) {
  namespace nn = torch::nn;
  const int64_t channels = spec.input_shape.front();
  const double flops = conv_flops(channels, kConvnetChannels, 3, spec.input_shape[1] - 2,
                                  spec.input_shape[2] - 2) +
                       linear_flops(kConvnetChannels, spec.classes);
  return built(nn::Sequential(
      nn::Conv2d(nn::Conv2dOptions(channels, kConvnetChannels, 3)), nn::ReLU(),
      nn::AdaptiveAvgPool2d(1), nn::Flatten(),
      nn::Linear(kConvnetChannels, spec.classes)), flops);
}

}  // namespace batchtune::models
