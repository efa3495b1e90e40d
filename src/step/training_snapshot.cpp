#include "step/training_snapshot.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <set>
#include <sstream>

#include "batchtune/memory/budget_allocator.h"
#include "batchtune/models/model.h"
#include "memory/cuda_support.h"

namespace batchtune {
namespace {

at::Tensor host_copy(const at::Tensor& t) {
  if (!t.defined()) return t;
  // Kept off the measured device: host memory, and not counted by the CPU budget.
  BudgetAllocator::UncountedScope uncounted;
  return t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
}

/// The CUDA devices the model's tensors are on, each once.
std::vector<int> cuda_devices(Model& model) {
  std::set<int> indices;
  for (const auto& t : model.parameters()) {
    if (t.is_cuda()) indices.insert(t.get_device());
  }
  for (const auto& t : model.buffers()) {
    if (t.is_cuda()) indices.insert(t.get_device());
  }
  return {indices.begin(), indices.end()};
}

void copy_back(at::Tensor& target, const at::Tensor& saved) {
  at::NoGradGuard no_grad;
  target.copy_(saved);
}

}  // namespace

TrainingSnapshot::TrainingSnapshot(Model& model, torch::optim::Optimizer& optimizer)
    : model_(model), optimizer_(optimizer) {
  for (const auto& p : model_.parameters()) {
    parameters_.push_back(host_copy(p));
    gradients_.push_back(host_copy(p.grad()));
  }
  for (const auto& b : model_.buffers()) buffers_.push_back(host_copy(b));
  for (const auto& [key, state] : optimizer_.state()) {
    BudgetAllocator::UncountedScope uncounted;
    torch::serialize::OutputArchive archive;
    state->serialize(archive);
    std::ostringstream bytes;
    archive.save_to(bytes);
    optimizer_state_.emplace(key, bytes.str());
  }
  generator_state_ = host_copy(at::detail::getDefaultCPUGenerator().get_state());
  for (int index : cuda_devices(model_)) {
    cuda_generator_states_.emplace_back(index, host_copy(cuda::generator_state(index)));
  }
}

void TrainingSnapshot::restore() {
  auto params = model_.parameters();
  TORCH_INTERNAL_ASSERT(params.size() == parameters_.size(),
                        "TrainingSnapshot: the model's parameters changed during a trial");
  for (size_t i = 0; i < params.size(); ++i) {
    copy_back(params[i], parameters_[i]);
    if (!gradients_[i].defined()) {
      params[i].mutable_grad() = at::Tensor();
    } else if (params[i].grad().defined()) {
      copy_back(params[i].mutable_grad(), gradients_[i]);
    } else {
      params[i].mutable_grad() = gradients_[i].to(params[i].device(), /*non_blocking=*/false,
                                                   /*copy=*/true);
    }
  }
  auto buffers = model_.buffers();
  for (size_t i = 0; i < buffers.size(); ++i) copy_back(buffers[i], buffers_[i]);

  auto& state = optimizer_.state();
  const c10::Device device = params.empty() ? c10::Device(c10::kCPU) : params.front().device();
  for (auto it = state.begin(); it != state.end();) {
    const auto saved = optimizer_state_.find(it->first);
    if (saved == optimizer_state_.end()) {
      it = state.erase(it);  // state the trial's first step created
      continue;
    }
    std::istringstream bytes(saved->second);
    torch::serialize::InputArchive archive;
    archive.load_from(bytes, device);
    it->second->serialize(archive);
    ++it;
  }
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  generator.set_state(generator_state_);
  for (const auto& [index, saved] : cuda_generator_states_) cuda::set_generator_state(index, saved);
}

}  // namespace batchtune
