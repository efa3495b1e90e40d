#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace batchtune {

class Model;

/// A host-side copy of everything a training step changes: parameters,
/// gradients, buffers, optimizer state, the CPU random generator and the
/// default CUDA generator of each CUDA device the model is on (dropout and
/// random augmentation on the GPU draw from it).
/// `restore()` puts it back bit for bit, in place, so that tensor identities
/// (which the optimizer keys its state by) do not change.
class TrainingSnapshot {
 public:
  TrainingSnapshot(Model& model, torch::optim::Optimizer& optimizer);
  void restore();

 private:
  Model& model_;
  torch::optim::Optimizer& optimizer_;
  std::vector<at::Tensor> parameters_;
  std::vector<at::Tensor> gradients_;  // undefined where the parameter had none
  std::vector<at::Tensor> buffers_;
  /// Serialized state of each parameter that had optimizer state.
  std::unordered_map<void*, std::string> optimizer_state_;
  at::Tensor generator_state_;
  /// (CUDA device index, its generator's state).
  std::vector<std::pair<int, at::Tensor>> cuda_generator_states_;
};

}  // namespace batchtune
