#include "batchtune/step/workload.h"

#include <ATen/CPUGeneratorImpl.h>
#include <algorithm>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/common/shape.h"
#include "step/training_snapshot.h"

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
  throw OptionError(Option::kOptimizer, fmt::format("unknown optimizer '{}'; use {}", name,
                                                     fmt::join(optimizer_names(), ", ")));
}

std::string shape_text(at::IntArrayRef sizes) { return fmt::format("[{}]", fmt::join(sizes, ", ")); }

/// Per-sample random data of one input or target, batch dimension first.
at::Tensor synthetic(const std::vector<int64_t>& sample_shape, int64_t batch_size,
                     c10::ScalarType dtype, int64_t high, at::Generator& generator) {
  std::vector<int64_t> shape{batch_size};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  if (dtype == at::kLong) {
    return at::randint(high, shape, generator, at::TensorOptions().dtype(at::kLong));
  }
  at::Tensor values = at::randn(shape, generator, at::TensorOptions().dtype(at::kFloat));
  return dtype == at::kFloat ? values : values.to(dtype);
}

/// The model's output as float32 for the loss (a float16 or bfloat16 model
/// computes its loss in float32, as autocast does).
at::Tensor for_loss(const at::Tensor& output) {
  return output.scalar_type() == at::kFloat || output.scalar_type() == at::kDouble
             ? output
             : output.to(at::kFloat);
}

at::Tensor spec_loss(const InputSpec& spec, const at::Tensor& output, const Batch& batch,
                     const std::string& model) {
  namespace F = torch::nn::functional;
  const int64_t b = batch.size();
  const auto mismatch = [&](const std::string& expected) {
    return OptionError(Option::kModel, model,
                       fmt::format("its output is {} but {} targets need {}",
                                   shape_text(output.sizes()), target_name(spec.target.kind),
                                   expected));
  };
  switch (spec.loss) {
    case LossKind::kModel:
      if (output.numel() != 1 || !output.is_floating_point()) {
        throw OptionError(Option::kLoss, "model",
                          fmt::format("the loss from {} must be a float scalar, got {} {}", model,
                                      dtype_name(output.scalar_type()),
                                      shape_text(output.sizes())));
      }
      return for_loss(output).reshape({});
    case LossKind::kMse: {
      if (output.sizes() != batch.target.sizes()) {
        throw mismatch(shape_text(batch.target.sizes()) + " (mse compares them element-wise)");
      }
      return F::mse_loss(for_loss(output), batch.target.to(at::kFloat));
    }
    case LossKind::kCrossEntropy:
      break;
  }
  const int64_t classes = spec.target.classes;
  if (spec.target.kind == TargetKind::kToken) {
    const int64_t t = batch.target.size(1);
    if (output.dim() != 3 || output.size(0) != b || output.size(1) != t ||
        output.size(2) != classes) {
      throw mismatch(fmt::format("[{}, {}, {}] (batch, tokens, classes)", b, t, classes));
    }
    return F::cross_entropy(for_loss(output).reshape({b * t, classes}),
                            batch.target.reshape({b * t}));
  }
  if (output.dim() != 2 || output.size(0) != b || output.size(1) != classes) {
    throw mismatch(fmt::format("[{}, {}] (batch, classes); set {} to the model's", b, classes,
                               mention(Option::kClasses)));
  }
  return F::cross_entropy(for_loss(output), batch.target);
}

bool is_builtin(const std::string& model) {
  const auto names = builtin_model_names();
  return std::find(names.begin(), names.end(), model) != names.end();
}

/// What the built-in models can take; a TorchScript model takes anything.
void check_builtin_spec(const std::string& model, const InputSpec& spec) {
  if (spec.inputs.size() != 1) {
    throw OptionError(Option::kInput, fmt::format("the built-in model {} takes one input, got {}; "
                                                  "use a TorchScript model for more",
                                                  model, spec.inputs.size()));
  }
  const auto dtype = spec.inputs.front().dtype;
  if (dtype != at::kFloat && dtype != at::kLong) {
    throw OptionError(Option::kInput, fmt::format("the built-in model {} takes float32 input (or "
                                                  "int64 token ids for gpt), not {}",
                                                  model, dtype_name(dtype)));
  }
  if (spec.loss == LossKind::kModel) {
    throw OptionError(Option::kLoss, "model",
                      fmt::format("the built-in model {} returns logits, not a loss; use ce or mse",
                                  model));
  }
}

ModelSpec model_spec(const WorkloadOptions& options, const InputSpec& spec) {
  ModelSpec model;
  model.input_shape = spec.inputs.front().shape;
  model.vocab = spec.inputs.front().vocab;
  model.classes = spec.target.classes;
  if (spec.target.kind == TargetKind::kRegression) {
    model.classes = 1;
    for (int64_t dim : spec.target.shape) model.classes *= dim;
  }
  model.gpt = options.gpt();
  model.checkpointing = options.checkpointing();
  return model;
}

}  // namespace

InputSpec resolve_input_spec(const WorkloadOptions& options) {
  InputSpec spec;
  if (options.input_spec()) {
    spec = *options.input_spec();
  } else if (options.model() == "gpt") {
    spec = token_spec(kGptDefaultLength, kGptDefaultVocab);
  } else {
    spec = classification_spec(options.input_shape(), options.classes());
  }
  validate(spec, "--input");
  return spec;
}

std::vector<std::string> optimizer_names() { return {"adam", "adamw", "sgd"}; }

Workload::Workload(WorkloadOptions options) : Workload(std::move(options), nullptr) {}

Workload::Workload(WorkloadOptions options, std::unique_ptr<Model> model)
    : options_(std::move(options)), spec_(resolve_input_spec(options_)) {
  if (!(options_.lr() > 0)) {
    throw OptionError(Option::kLr, fmt::format("must be positive, got {}", options_.lr()));
  }
  torch::manual_seed(options_.seed());
  if (model) {
    model_ = std::move(model);
  } else {
    if (is_builtin(options_.model())) check_builtin_spec(options_.model(), spec_);
    model_ = make_model(options_.model(), model_spec(options_, spec_));
  }
  model_->to(options_.device());
  model_->train(true);
  optimizer_ = make_optimizer(options_.optimizer(), model_->parameters(), options_.lr());
  check_trains();
}

Workload::~Workload() = default;

void Workload::check_trains() {
  if (model_->parameters().empty()) {
    throw OptionError(Option::kModel, options_.model(), "no trainable parameters");
  }
  // One forward and loss on a tiny batch, so that a model that cannot take
  // the spec fails here with a clear message, not in the middle of a search.
  // Batch 2: batch norm needs more than one value per channel in training.
  constexpr int64_t kCheckBatch = 2;
  TrainingSnapshot snapshot(*model_, *optimizer_);
  {
    torch::NoGradGuard no_grad;
    compute_loss(synthetic_batch(kCheckBatch));
  }
  snapshot.restore();
}

Batch Workload::synthetic_batch(int64_t batch_size) const {
  return synthetic_batch_of(spec_, batch_size,
                            options_.seed() * 1000003 + static_cast<uint64_t>(batch_size));
}

Batch Workload::synthetic_batch(int64_t batch_size, int64_t length) const {
  if (length == sequence_length(spec_)) return synthetic_batch(batch_size);
  return synthetic_batch_of(at_length(spec_, length), batch_size,
                            options_.seed() * 1000003 + static_cast<uint64_t>(batch_size) +
                                static_cast<uint64_t>(length) * 7919);
}

Batch Workload::synthetic_batch_of(const InputSpec& spec, int64_t batch_size,
                                   uint64_t seed) const {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  Batch batch;
  for (const auto& input : spec.inputs) {
    batch.inputs.push_back(synthetic(input.shape, batch_size, input.dtype, input.vocab, generator));
  }
  switch (spec.target.kind) {
    case TargetKind::kClass:
    case TargetKind::kToken:
      batch.target = synthetic(spec.target.shape, batch_size, at::kLong, spec.target.classes,
                               generator);
      break;
    case TargetKind::kRegression:
      batch.target = synthetic(spec.target.shape, batch_size, at::kFloat, 0, generator);
      break;
    case TargetKind::kNone:
      break;
  }
  if (!options_.device().is_cpu()) {
    for (auto& input : batch.inputs) input = input.to(options_.device());
    if (batch.target.defined()) batch.target = batch.target.to(options_.device());
  }
  return batch;
}

at::Tensor Workload::compute_loss(const Batch& batch) {
  if (spec_.loss == LossKind::kModel && batch.target.defined()) {
    std::vector<at::Tensor> arguments = batch.inputs;
    arguments.push_back(batch.target);
    return spec_loss(spec_, model_->forward(arguments), batch, options_.model());
  }
  return spec_loss(spec_, model_->forward(batch.inputs), batch, options_.model());
}

int64_t Workload::parameter_count() const { return batchtune::parameter_count(*model_); }

}  // namespace batchtune
