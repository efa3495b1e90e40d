#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include "models/builtin_models.h"

namespace batchtune::models {

BuiltModule make_mlp(const ModelSpec& spec) {
  namespace nn = torch::nn;
  int64_t inputs = 1;
  for (int64_t dim : spec.input_shape) inputs *= dim;
  return built(nn::Sequential(nn::Flatten(), nn::Linear(inputs, spec.hidden),
                                      nn::ReLU(), nn::Linear(spec.hidden, spec.classes)),
               linear_flops(inputs, spec.hidden) + linear_flops(spec.hidden, spec.classes));
}

}  // namespace batchtune::models
