#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/data/batch.h"
#include "batchtune/data/input_spec.h"
#include "batchtune/models/model.h"

namespace batchtune {

/// What is trained: a model, its input, the loss and the optimizer.
///
/// Example:
/// ```
///   batchtune::Workload workload(batchtune::WorkloadOptions()
///                                    .model("resnet18")
///                                    .input_shape({3, 64, 64})
///                                    .optimizer("sgd"));
///   auto batch = workload.synthetic_batch(32);
///   at::Tensor loss = workload.compute_loss(batch);
/// ```
struct WorkloadOptions {
  /// Built-in model name (see `builtin_model_names()`) or a TorchScript file
  /// (`model.pt`, see `load_script_model`).
  TORCH_ARG(std::string, model) = "convnet";
  /// Per-sample input shape, no batch dimension: one float32 input with
  /// `classes` class targets. Ignored when `input_spec` is given.
  TORCH_ARG(std::vector<int64_t>, input_shape) = std::vector<int64_t>{3, 64, 64};
  TORCH_ARG(int64_t, classes) = 10;
  /// Inputs, targets and loss in full (see `InputSpec`). Without it: the
  /// input shape and classes above, or for `gpt` `token_spec(64, 256)`.
  TORCH_ARG(std::optional<InputSpec>, input_spec) = std::nullopt;
  /// Sizes of the `gpt` model.
  TORCH_ARG(GptOptions, gpt) = GptOptions();
  /// Activation checkpointing of the built-in model's blocks (`gpt`,
  /// `resnet18`; see `ModelSpec::checkpointing`).
  TORCH_ARG(bool, checkpointing) = false;
  /// `adam` (the default, as in the guide), `adamw` or `sgd` (momentum 0.9).
  TORCH_ARG(std::string, optimizer) = "adam";
  TORCH_ARG(double, lr) = 1e-3;
  /// Seeds the model's initial weights and the synthetic data.
  TORCH_ARG(uint64_t, seed) = 0;
  TORCH_ARG(c10::Device, device) = c10::Device(c10::kCPU);
};

/// Momentum of the `sgd` optimizer: the usual choice for vision models.
constexpr double kSgdMomentum = 0.9;

/// `gpt`'s input when none is given: 64 tokens of a 256-symbol (byte) vocabulary.
constexpr int64_t kGptDefaultLength = 64;
constexpr int64_t kGptDefaultVocab = 256;

/// The input spec `options` stand for, validated: `input_spec` if given, else
/// the model's default. Throws `batchtune::Error`.
InputSpec resolve_input_spec(const WorkloadOptions& options);

class Workload {
 public:
  /// Builds the model on the device and its optimizer. Throws
  /// `batchtune::Error` for an unknown model or optimizer, or a bad shape,
  /// or a model that cannot train on the input spec (checked with one
  /// forward and loss at batch size 2, which leaves no trace).
  explicit Workload(WorkloadOptions options);
  /// The same on a model of your own (a `ModuleModel` over a torch::nn
  /// module, a TorchScript model); `options.model()` is then only its name.
  Workload(WorkloadOptions options, std::unique_ptr<Model> model);
  ~Workload();

  const WorkloadOptions& options() const { return options_; }
  /// What batches hold and how the loss is computed.
  const InputSpec& input_spec() const { return spec_; }
  Model& model() { return *model_; }
  /// Number of parameter elements of the model (a plan records it: two
  /// sizes of one built-in model share its name).
  int64_t parameter_count() const;
  torch::optim::Optimizer& optimizer() { return *optimizer_; }

  /// A batch of random inputs and labels on the device, the same for the
  /// same size (seeded from `seed` and `batch_size`).
  Batch synthetic_batch(int64_t batch_size) const;
  /// The same with sequences `length` long (see `at_length`): for a length
  /// range, batches at any length in it. Throws `batchtune::Error` for a
  /// length outside it.
  Batch synthetic_batch(int64_t batch_size, int64_t length) const;

  /// Forward and loss, as the spec says: cross-entropy over class or
  /// per-token targets, MSE over float targets, or the model's own scalar
  /// loss. Returns the loss with its graph. Throws `batchtune::Error` when
  /// the model's output does not suit the targets, or the loss is not a
  /// scalar.
  at::Tensor compute_loss(const Batch& batch);

 private:
  void check_trains();
  Batch synthetic_batch_of(const InputSpec& spec, int64_t batch_size, uint64_t seed) const;

  WorkloadOptions options_;
  InputSpec spec_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

/// Names of the optimizers `WorkloadOptions::optimizer` takes.
std::vector<std::string> optimizer_names();

}  // namespace batchtune
