#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "batchtune/models/model.h"

namespace batchtune {

/// A `torch::nn` module seen as a batchtune `Model`: how the built-in models,
/// and any LibTorch model of your own, reach the trial runner.
///
/// Example:
/// ```
///   auto net = torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(784, 10));
///   auto model = batchtune::make_module_model("my-mlp", net);
///   batchtune::Workload workload(batchtune::WorkloadOptions().input_shape({1, 28, 28}),
///                                std::move(model));
/// ```
class ModuleModel final : public Model {
 public:
  using Forward = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

  ModuleModel(std::string name, std::shared_ptr<torch::nn::Module> module, Forward forward,
              std::optional<double> forward_flops = std::nullopt);

  using Model::forward;
  at::Tensor forward(const std::vector<at::Tensor>& inputs) override;
  std::vector<at::Tensor> parameters() override;
  std::vector<at::Tensor> buffers() override;
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() override;
  std::vector<std::pair<std::string, at::Tensor>> named_buffers() override;
  void train(bool on) override;
  void to(const c10::Device& device) override;
  std::string describe() const override;
  std::optional<double> forward_flops_per_sample() const override { return forward_flops_; }

 private:
  std::string name_;
  std::shared_ptr<torch::nn::Module> module_;
  Forward forward_;
  std::optional<double> forward_flops_;
};

/// Wraps a module holder (`torch::nn::Sequential`, your `TORCH_MODULE`)
/// whose `forward` takes one tensor.
template <typename Holder>
std::unique_ptr<Model> make_module_model(std::string name, Holder holder) {
  return std::make_unique<ModuleModel>(
      std::move(name), holder.ptr(),
      [holder](const std::vector<at::Tensor>& inputs) mutable {
        return holder->forward(inputs.at(0));
      });
}

}  // namespace batchtune
