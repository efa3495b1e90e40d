#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace batchtune {

/// Sizes of the built-in `gpt`, a small decoder-only transformer. Its
/// vocabulary and longest sequence come from the input (`int64:LEN`, `--vocab`).
///
/// Example:
/// ```
///   batchtune::GptOptions().layers(4).heads(4).width(256).tied_head(false);
/// ```
struct GptOptions {
  /// Transformer blocks.
  TORCH_ARG(int64_t, layers) = 2;
  /// Attention heads; `width` must be a multiple of it.
  TORCH_ARG(int64_t, heads) = 2;
  /// Embedding width; the MLP is 4x as wide.
  TORCH_ARG(int64_t, width) = 64;
  /// The output head shares the token embedding's weights (as GPT-2 does).
  TORCH_ARG(bool, tied_head) = true;
};

/// What a built-in model is made for: the per-sample input shape (no batch
/// dimension) and the number of classes it predicts.
struct ModelSpec {
  std::vector<int64_t> input_shape{3, 64, 64};
  /// Classes of the output (for a float target: its elements per sample).
  int64_t classes = 10;
  /// Width of the hidden layer of `mlp`.
  int64_t hidden = 256;
  /// Vocabulary of token-id input (0: the input is float).
  int64_t vocab = 0;
  GptOptions gpt;
  /// Activation checkpointing: each block's activations (gpt's transformer
  /// blocks, resnet18's residual blocks) are recomputed in the backward pass
  /// instead of kept (see `checkpointed`). The other built-in models have no
  /// blocks and refuse it.
  bool checkpointing = false;
};

/// A trainable model, whatever made it (torch::nn or TorchScript).
/// The trial runner and the training loop see only this.
class Model {
 public:
  virtual ~Model() = default;
  /// Runs the model on a batch's inputs (and, when the model computes its
  /// own loss, the target after them). Returns its output: logits, or the
  /// loss.
  virtual at::Tensor forward(const std::vector<at::Tensor>& inputs) = 0;
  /// The same with one input.
  at::Tensor forward(const at::Tensor& input) { return forward(std::vector<at::Tensor>{input}); }
  /// Trainable parameters, in a fixed order.
  virtual std::vector<at::Tensor> parameters() = 0;
  /// Buffers (batch-norm running statistics...), in a fixed order.
  virtual std::vector<at::Tensor> buffers() = 0;
  /// `parameters()` with their names (`conv1.weight`), in the same order;
  /// by default `param.0`, `param.1`... for a model that has no names.
  virtual std::vector<std::pair<std::string, at::Tensor>> named_parameters();
  /// `buffers()` with their names, in the same order (default `buffer.0`...).
  virtual std::vector<std::pair<std::string, at::Tensor>> named_buffers();
  /// The model as a TorchScript archive with its current weights, where it is
  /// one (a model loaded with `load_script_model`); nullopt otherwise.
  virtual std::optional<std::string> torchscript_bytes() { return std::nullopt; }
  virtual void train(bool on) = 0;
  virtual void to(const c10::Device& device) = 0;
  /// Short description for logs: "resnet18 (11.2M parameters)".
  virtual std::string describe() const = 0;
  /// Floating-point operations of one sample's forward pass (a multiply-add
  /// counts 2), where known: the built-in models count theirs. A training
  /// step costs about 3x this (backward is about twice the forward).
  virtual std::optional<double> forward_flops_per_sample() const { return std::nullopt; }
};

/// Names of the built-in models, the default first.
std::vector<std::string> builtin_model_names();

/// Builds a built-in model by name, initialised from LibTorch's global RNG.
/// Throws `batchtune::Error` for an unknown name or an input shape the model
/// cannot take (e.g. `lenet` on a 4x4 image).
///
/// Example:
/// ```
///   auto model = batchtune::make_builtin_model("convnet", {{3, 64, 64}, 10});
/// ```
std::unique_ptr<Model> make_builtin_model(const std::string& name, const ModelSpec& spec);

/// Whether `--model` names a TorchScript file rather than a built-in model:
/// it ends in `.pt`, `.pth` or `.ts`, or it is an existing file.
bool is_script_model_path(const std::string& name);

/// A built-in model by name, or a TorchScript module loaded from a file
/// (see `load_script_model`). Throws `batchtune::Error`.
///
/// Example:
/// ```
///   auto model = batchtune::make_model("my_model.pt", {});
/// ```
std::unique_ptr<Model> make_model(const std::string& name_or_path, const ModelSpec& spec);

/// Bytes of the parameters of `model`.
int64_t parameter_bytes(Model& model);
/// Number of parameter elements of `model`.
int64_t parameter_count(Model& model);

}  // namespace batchtune
