#include "batchtune/models/module_model.h"

#include <fmt/format.h>

#include "batchtune/common/error.h"

namespace batchtune {

ModuleModel::ModuleModel(std::string name, std::shared_ptr<torch::nn::Module> module,
                         Forward forward, std::optional<double> forward_flops)
    : name_(std::move(name)),
      module_(std::move(module)),
      forward_(std::move(forward)),
      forward_flops_(forward_flops) {
  TORCH_CHECK(module_ != nullptr, "ModuleModel: null module for ", name_);
}

at::Tensor ModuleModel::forward(const std::vector<at::Tensor>& inputs) {
  return forward_(inputs);
}

std::vector<at::Tensor> ModuleModel::parameters() { return module_->parameters(); }
std::vector<at::Tensor> ModuleModel::buffers() { return module_->buffers(); }
std::vector<std::pair<std::string, at::Tensor>> ModuleModel::named_parameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module_->named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> ModuleModel::named_buffers() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module_->named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

void ModuleModel::train(bool on) { module_->train(on); }
void ModuleModel::to(const c10::Device& device) { module_->to(device); }

std::string ModuleModel::describe() const {
  int64_t count = 0;
  for (const auto& p : module_->parameters()) count += p.numel();
  return fmt::format("{} ({} parameters)", name_, count);
}

}  // namespace batchtune
