#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "batchtune/model.h"

namespace batchtune {

/// One batch of training data on the workload's device.
struct Batch {
  at::Tensor input;   ///< [batch, ...input_shape]
  at::Tensor target;  ///< [batch] class indices
  int64_t size() const { return input.size(0); }
};

/// What is trained: a model, its input, the loss and the optimizer.
///
/// Example:
/// ```
///   batchtune::Workload workload(batchtune::WorkloadOptions()
///                                    .model("resnet18")
///                                    .input_shape({3, 64, 64})
///                                    .optimizer("sgd"));
///   auto batch = workload.synthetic_batch(32);
///   double loss = workload.step(batch);
/// ```
struct WorkloadOptions {
  /// Built-in model name (see `builtin_model_names()`).
  TORCH_ARG(std::string, model) = "convnet";
  /// Per-sample input shape, no batch dimension.
  TORCH_ARG(std::vector<int64_t>, input_shape) = std::vector<int64_t>{3, 64, 64};
  TORCH_ARG(int64_t, classes) = 10;
  /// `adam` (the default, as in the guide), `adamw` or `sgd` (momentum 0.9).
  TORCH_ARG(std::string, optimizer) = "adam";
  TORCH_ARG(double, lr) = 1e-3;
  /// Seeds the model's initial weights and the synthetic data.
  TORCH_ARG(uint64_t, seed) = 0;
  TORCH_ARG(c10::Device, device) = c10::Device(c10::kCPU);
};

/// Momentum of the `sgd` optimizer: the usual choice for vision models.
constexpr double kSgdMomentum = 0.9;

class Workload {
 public:
  /// Builds the model on the device and its optimizer. Throws
  /// `batchtune::Error` for an unknown model or optimizer, or a bad shape.
  explicit Workload(WorkloadOptions options);
  ~Workload();

  const WorkloadOptions& options() const { return options_; }
  Model& model() { return *model_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }

  /// A batch of random inputs and labels on the device, the same for the
  /// same size (seeded from `seed` and `batch_size`).
  Batch synthetic_batch(int64_t batch_size) const;

  /// Forward and cross-entropy loss (mean over the batch), with its graph:
  /// what `step` and the training loop's micro-batches back-propagate.
  at::Tensor compute_loss(const Batch& batch);

  /// The real training step: forward, loss, backward, optimizer step, and
  /// gradients set to none. Returns the loss, detached.
  at::Tensor step(const Batch& batch);

 private:
  WorkloadOptions options_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

/// Names of the optimizers `WorkloadOptions::optimizer` takes.
std::vector<std::string> optimizer_names();

}  // namespace batchtune
