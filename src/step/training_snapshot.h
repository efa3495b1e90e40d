#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace batchtune {

class Model;

/// A host-side copy of everything a training step changes: parameters,
/// gradients, buffers, optimizer state and the CPU random generator.
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
};

}  // namespace batchtune
