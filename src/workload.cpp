#include "batchtune/workload.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include "batchtune/error.h"

namespace batchtune {
namespace {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<at::Tensor> params,
                                                        double lr) {
  if (name == "adam") {
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(lr));
  }
  if (name == "adamw") {
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(lr));
  }
  if (name == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(lr).momentum(kSgdMomentum));
  }
  throw Error(fmt::format("--optimizer: unknown optimizer '{}'; use {}", name,
                          fmt::join(optimizer_names(), ", ")));
}

}  // namespace

std::vector<std::string> optimizer_names() { return {"adam", "adamw", "sgd"}; }

Workload::Workload(WorkloadOptions options) : options_(std::move(options)) {
  if (!(options_.lr() > 0)) {
    throw Error(fmt::format("--lr: must be positive, got {}", options_.lr()));
  }
  torch::manual_seed(options_.seed());
  ModelSpec spec;
  spec.input_shape = options_.input_shape();
  spec.classes = options_.classes();
  model_ = make_builtin_model(options_.model(), spec);
  model_->to(options_.device());
  model_->train(true);
  optimizer_ = make_optimizer(options_.optimizer(), model_->parameters(), options_.lr());
}

Workload::~Workload() = default;

Batch Workload::synthetic_batch(int64_t batch_size) const {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(
      options_.seed() * 1000003 + static_cast<uint64_t>(batch_size));
  std::vector<int64_t> shape{batch_size};
  shape.insert(shape.end(), options_.input_shape().begin(), options_.input_shape().end());
  Batch batch;
  batch.input = at::randn(shape, generator, at::TensorOptions().dtype(at::kFloat));
  batch.target = at::randint(options_.classes(), {batch_size}, generator,
                             at::TensorOptions().dtype(at::kLong));
  if (!options_.device().is_cpu()) {
    batch.input = batch.input.to(options_.device());
    batch.target = batch.target.to(options_.device());
  }
  return batch;
}

at::Tensor Workload::compute_loss(const Batch& batch) {
  const at::Tensor output = model_->forward(batch.input);
  return torch::nn::functional::cross_entropy(output, batch.target);
}

at::Tensor Workload::step(const Batch& batch) {
  at::Tensor loss = compute_loss(batch);
  loss.backward();
  optimizer_->step();
  optimizer_->zero_grad(/*set_to_none=*/true);
  return loss.detach();
}

}  // namespace batchtune
