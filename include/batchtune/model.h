#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace batchtune {

/// What a built-in model is made for: the per-sample input shape (no batch
/// dimension) and the number of classes it predicts.
struct ModelSpec {
  std::vector<int64_t> input_shape{3, 64, 64};
  int64_t classes = 10;
  /// Width of the hidden layer of `mlp`.
  int64_t hidden = 256;
};

/// A trainable model, whatever made it (torch::nn or, later, TorchScript).
/// The trial runner and the training loop see only this.
class Model {
 public:
  virtual ~Model() = default;
  virtual at::Tensor forward(const at::Tensor& input) = 0;
  /// Trainable parameters, in a fixed order.
  virtual std::vector<at::Tensor> parameters() = 0;
  /// Buffers (batch-norm running statistics...), in a fixed order.
  virtual std::vector<at::Tensor> buffers() = 0;
  virtual void train(bool on) = 0;
  virtual void to(const c10::Device& device) = 0;
  /// Short description for logs: "resnet18 (11.2M parameters)".
  virtual std::string describe() const = 0;
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

/// Bytes of the parameters of `model`.
int64_t parameter_bytes(Model& model);
/// Number of parameter elements of `model`.
int64_t parameter_count(Model& model);

}  // namespace batchtune
