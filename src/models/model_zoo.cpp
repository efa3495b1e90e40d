// The table of built-in models, and the Model adapter over torch::nn.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>

#include <functional>

#include "batchtune/error.h"
#include "batchtune/model.h"
#include "batchtune/shape.h"
#include "builtin_models.h"

namespace batchtune {
namespace {

/// A torch::nn module seen as a batchtune Model.
class ModuleModel final : public Model {
 public:
  ModuleModel(std::string name, models::BuiltModule module)
      : name_(std::move(name)), module_(std::move(module)) {}

  at::Tensor forward(const at::Tensor& input) override { return module_.forward(input); }
  std::vector<at::Tensor> parameters() override { return module_.module->parameters(); }
  std::vector<at::Tensor> buffers() override { return module_.module->buffers(); }
  void train(bool on) override { module_.module->train(on); }
  void to(const c10::Device& device) override { module_.module->to(device); }
  std::string describe() const override {
    int64_t count = 0;
    for (const auto& p : module_.module->parameters()) count += p.numel();
    return fmt::format("{} ({} parameters)", name_, count);
  }

 private:
  std::string name_;
  models::BuiltModule module_;
};

struct BuiltinModel {
  const char* name;
  std::function<models::BuiltModule(const ModelSpec&)> make;
  size_t min_rank;  ///< input dimensions the model needs, at least
};

const std::vector<BuiltinModel>& zoo() {
  static const std::vector<BuiltinModel> models = {
      {"convnet", models::make_convnet, 3},
      {"mlp", models::make_mlp, 1},
      {"lenet", models::make_lenet, 3},
      {"resnet18", models::make_resnet18, 3},
  };
  return models;
}

}  // namespace

std::vector<std::string> builtin_model_names() {
  std::vector<std::string> names;
  for (const auto& m : zoo()) names.emplace_back(m.name);
  return names;
}

std::unique_ptr<Model> make_builtin_model(const std::string& name, const ModelSpec& spec) {
  for (const auto& m : zoo()) {
    if (name != m.name) continue;
    if (spec.input_shape.size() != m.min_rank && m.min_rank == 3) {
      throw Error(fmt::format("--input: {} needs an image shape CxHxW, like 3x64x64; got {}",
                              name, format_shape(spec.input_shape)));
    }
    if (spec.classes < 2) {
      throw Error(fmt::format("--classes: need at least 2 classes, got {}", spec.classes));
    }
    return std::make_unique<ModuleModel>(name, m.make(spec));
  }
  throw Error(fmt::format("--model: unknown model '{}'; built-in models are {}", name,
                          fmt::join(builtin_model_names(), ", ")));
}

int64_t parameter_bytes(Model& model) {
  int64_t bytes = 0;
  for (const auto& p : model.parameters()) bytes += p.numel() * p.element_size();
  return bytes;
}

int64_t parameter_count(Model& model) {
  int64_t count = 0;
  for (const auto& p : model.parameters()) count += p.numel();
  return count;
}

}  // namespace batchtune
