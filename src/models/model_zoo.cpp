// The table of built-in models, and the choice between them and TorchScript files.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>

#include <sys/stat.h>

#include <functional>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/models/model.h"
#include "batchtune/models/module_model.h"
#include "batchtune/models/script_model.h"
#include "batchtune/common/shape.h"
#include "models/builtin_models.h"

namespace batchtune {
namespace {

struct BuiltinModel {
  const char* name;
  std::function<models::BuiltModule(const ModelSpec&)> make;
  size_t min_rank;  ///< input dimensions the model needs, at least
  bool tokens;      ///< takes token ids (int64) rather than float input
  bool blocks;      ///< has blocks that activation checkpointing recomputes
};

const std::vector<BuiltinModel>& zoo() {
  static const std::vector<BuiltinModel> models = {
      {"convnet", models::make_convnet, 3, false, false},
      {"mlp", models::make_mlp, 1, false, false},
      {"lenet", models::make_lenet, 3, false, false},
      {"resnet18", models::make_resnet18, 3, false, true},
      {"gpt", models::make_gpt, 1, true, true},
  };
  return models;
}

/// The built-in models with blocks to recompute.
std::vector<std::string> checkpointed_model_names() {
  std::vector<std::string> names;
  for (const auto& m : zoo()) {
    if (m.blocks) names.emplace_back(m.name);
  }
  return names;
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
    if (m.tokens && spec.vocab < 1) {
      throw OptionError(Option::kInput,
                        fmt::format("{} takes token ids, like {} int64:128 {} 32000; got float "
                                    "input {}",
                                    name, mention(Option::kInput), mention(Option::kVocab),
                                    format_shape(spec.input_shape)));
    }
    if (!m.tokens && spec.vocab > 0) {
      throw OptionError(Option::kInput, fmt::format("{} takes float input, not token ids; use gpt "
                                                    "or a TorchScript model for token ids",
                                                    name));
    }
    if (spec.input_shape.size() != m.min_rank && m.min_rank == 3) {
      throw OptionError(Option::kInput, fmt::format("{} needs an image shape CxHxW, like 3x64x64; "
                                                    "got {}",
                                                    name, format_shape(spec.input_shape)));
    }
    if (spec.classes < 2) {
      throw OptionError(Option::kClasses,
                        fmt::format("need at least 2 classes, got {}", spec.classes));
    }
    if (spec.checkpointing && !m.blocks) {
      throw OptionError(Option::kCheckpointing,
                        fmt::format("{} has no blocks to recompute ({}'s are); leave it off, or "
                                    "use {} {}",
                                    name, fmt::join(checkpointed_model_names(), "'s and "),
                                    mention(Option::kModel),
                                    fmt::join(checkpointed_model_names(), " or ")));
    }
    models::BuiltModule built = m.make(spec);
    return std::make_unique<ModuleModel>(
        name, built.module,
        [forward = built.forward](const std::vector<at::Tensor>& inputs) {
          TORCH_CHECK(inputs.size() == 1, "built-in models take one input, got ", inputs.size());
          return forward(inputs.front());
        },
        built.forward_flops > 0 ? std::optional<double>(built.forward_flops) : std::nullopt);
  }
  throw OptionError(Option::kModel, fmt::format("unknown model '{}'; built-in models are {}", name,
                                                 fmt::join(builtin_model_names(), ", ")));
}

bool is_script_model_path(const std::string& name) {
  for (const char* suffix : {".pt", ".pth", ".ts"}) {
    const std::string ending(suffix);
    if (name.size() > ending.size() &&
        name.compare(name.size() - ending.size(), ending.size(), ending) == 0) {
      return true;
    }
  }
  // Anything there that is not a folder: a FIFO or device is then refused
  // as a model file, not called an unknown model name.
  struct stat info {};
  return stat(name.c_str(), &info) == 0 && !S_ISDIR(info.st_mode);
}

std::unique_ptr<Model> make_model(const std::string& name_or_path, const ModelSpec& spec) {
  if (is_script_model_path(name_or_path)) {
    if (spec.checkpointing) {
      throw OptionError(Option::kCheckpointing,
                        fmt::format("{} is a TorchScript model, whose blocks batchtune cannot "
                                    "recompute; leave it off, or use {} {}",
                                    name_or_path, mention(Option::kModel),
                                    fmt::join(checkpointed_model_names(), " or ")));
    }
    return load_script_model(name_or_path);
  }
  return make_builtin_model(name_or_path, spec);
}

std::vector<std::pair<std::string, at::Tensor>> Model::named_parameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : parameters()) out.emplace_back("param." + std::to_string(out.size()), p);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Model::named_buffers() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& b : buffers()) out.emplace_back("buffer." + std::to_string(out.size()), b);
  return out;
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
