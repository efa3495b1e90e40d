#include "workload_flags.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "batchtune/common/atomic_file.h"
#include "batchtune/monitoring/environment.h"
#include "batchtune/common/error.h"
#include "batchtune/models/model.h"
#include "batchtune/common/shape.h"
#include "batchtune/common/size.h"
#include "batchtune/plan/plan.h"

namespace batchtune::cli {
namespace {

/// A count given on the command line is at least 1 (0 stands for the
/// default inside, never for a count asked for).
CLI::Validator at_least_one() {
  return CLI::Validator(
      [](std::string& value) {
        char* end = nullptr;
        const long long n = std::strtoll(value.c_str(), &end, 10);
        // Not a number: the option's own conversion says so.
        if (end == value.c_str() || *end != '\0' || n >= 1) return std::string();
        return fmt::format("must be at least 1, got {}", value);
      },
      "N>=1");
}

}  // namespace

void add_workload_flags(CLI::App& app, WorkloadFlags& flags) {
  app.add_option("--model", flags.model,
                 fmt::format("model to train: {}, or a TorchScript file (model.pt)",
                             fmt::join(builtin_model_names(), ", ")))
      ->capture_default_str();
  auto* input = app.add_option(
      "--input", flags.inputs,
      "per-sample input shape without the batch dimension, with an optional dtype: 3x224x224, "
      "float16:3x224x224, bfloat16:..., int64:128 (token ids, longest sequence); repeat for "
      "more inputs (default 3x64x64, int64:64 for gpt)");
  input->take_all();
  // 0 inside stands for the default; given, a count of none is a mistake.
  auto* vocab = app.add_option("--vocab", flags.vocab,
                               "vocabulary of int64 token-id inputs (gpt default: 256)")
                    ->check(at_least_one());
  auto* classes = app.add_option(
                         "--classes", flags.classes,
                         "number of classes (default 10, or the vocabulary for per-token targets)")
                      ->check(at_least_one());
  auto* target = app.add_option(
      "--target", flags.target,
      "class, token (one class per token), float:SHAPE (regression), none, or auto (token "
      "when the input is token ids and --classes is left out or equals --vocab)")
                     ->capture_default_str();
  auto* loss = app.add_option("--loss", flags.loss,
                              "ce, mse, or model (forward returns the loss; default: ce for "
                              "class and token targets, mse for float)");
  app.add_option("--input-spec", flags.input_spec,
                 "JSON file with the inputs, target and loss (instead of --input, --vocab, "
                 "--classes, --target, --loss)")
      ->excludes(input)
      ->excludes(vocab)
      ->excludes(classes)
      ->excludes(target)
      ->excludes(loss);
  app.add_option("--layers", flags.layers, "gpt: transformer blocks")->capture_default_str();
  app.add_option("--heads", flags.heads, "gpt: attention heads")->capture_default_str();
  app.add_option("--width", flags.width, "gpt: embedding width")->capture_default_str();
  app.add_flag("--untied-head", flags.untied_head,
               "gpt: an output head of its own instead of the token embedding's weights");
  app.add_option("--checkpointing", flags.checkpointing,
                 "gpt and resnet18: off, or on (each block's activations recomputed in the "
                 "backward pass: less memory, one more forward pass)")
      ->check(CLI::IsMember({"off", "on"}))
      ->capture_default_str();
  app.add_option("--optimizer", flags.optimizer, "adam, adamw or sgd (momentum 0.9)")
      ->capture_default_str();
  app.add_option("--lr", flags.lr, "learning rate")->capture_default_str();
  app.add_option("--seed", flags.seed, "seed of the weights and the synthetic data")
      ->capture_default_str();
  app.add_option("--device", flags.device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--memory-limit", flags.memory_limit,
                 "device memory to use, like 512MiB or 2GiB (CPU default: half the "
                 "available RAM; CUDA default: the whole device)");
  app.add_option("--threads", flags.threads, "LibTorch CPU threads (default: all cores)");
}

InputSpec input_spec_from_flags(const WorkloadFlags& flags) {
  if (!flags.input_spec.empty()) return load_input_spec(flags.input_spec);
  const bool gpt = flags.model == "gpt";
  auto inputs = flags.inputs;
  if (inputs.empty()) {
    inputs.push_back(gpt ? fmt::format("int64:{}", kGptDefaultLength) : "3x64x64");
  }
  const int64_t vocab = flags.vocab == 0 && gpt ? kGptDefaultVocab : flags.vocab;
  return parse_input_flags(InputFlags()
                               .inputs(inputs)
                               .vocab(vocab)
                               .classes(flags.classes)
                               .target(flags.target)
                               .loss(flags.loss));
}

ResolvedWorkload resolve_workload(const WorkloadFlags& flags) {
  if (flags.threads < 0) {
    throw Error(fmt::format("--threads: must be 0 (all cores) or more, got {}", flags.threads));
  }
  if (flags.threads > kMaxThreads) {
    throw Error(fmt::format("--threads: must be at most {}, got {}", kMaxThreads, flags.threads));
  }
  if (!(flags.lr > 0) || !std::isfinite(flags.lr) || flags.lr > kMaxLearningRate) {
    throw Error(fmt::format("--lr: must be positive and at most {:g}, got {:g}",
                            kMaxLearningRate, flags.lr));
  }
  for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"--layers", flags.layers},
                                    {"--heads", flags.heads},
                                    {"--width", flags.width}}) {
    if (value > kMaxGptSize) {
      throw Error(fmt::format("{}: must be at most {}, got {}", flag, kMaxGptSize, value));
    }
  }
  const InputSpec spec = input_spec_from_flags(flags);
  const c10::Device device = parse_device(flags.device);
  std::optional<int64_t> limit;
  if (!flags.memory_limit.empty()) limit = parse_size(flags.memory_limit, "--memory-limit");

  ResolvedWorkload resolved;
  resolved.threads = configure_threads(flags.threads);
  // On the CPU the model is built under the budget: a model larger than
  // --memory-limit fails as it grows past it, not after taking the host's RAM.
  if (device.is_cpu()) resolved.memory = make_device_memory(device, limit);
  try {
    resolved.workload = std::make_unique<Workload>(WorkloadOptions()
                                                       .model(flags.model)
                                                       .input_spec(spec)
                                                       .gpt(GptOptions()
                                                                .layers(flags.layers)
                                                                .heads(flags.heads)
                                                                .width(flags.width)
                                                                .tied_head(!flags.untied_head))
                                                       .checkpointing(flags.checkpointing == "on")
                                                       .optimizer(flags.optimizer)
                                                       .lr(flags.lr)
                                                       .seed(flags.seed)
                                                       .device(device));
  } catch (const c10::OutOfMemoryError& e) {
    throw Error(fmt::format(
        "--memory-limit: {} cannot hold {} and one forward pass at batch 2 ({}); give a larger "
        "limit or a smaller model",
        limit ? format_bytes(*limit) : "the default CPU budget", flags.model,
        first_line(e.what_without_backtrace())));
  }
  const int64_t params = parameter_bytes(resolved.workload->model());
  if (limit && params >= *limit) {
    throw Error(fmt::format(
        "--memory-limit: {} cannot even hold the parameters of {} ({}); give a larger limit",
        format_bytes(*limit), resolved.workload->model().describe(), format_bytes(params)));
  }
  if (!resolved.memory) resolved.memory = make_device_memory(device, limit);
  return resolved;
}

void check_batch_size(int64_t batch, const InputSpec& spec, const std::string& flag) {
  if (batch < 1) throw Error(fmt::format("{}: must be at least 1, got {}", flag, batch));
  if (batch > kMaxPlanCount) {
    throw Error(fmt::format("{}: must be at most {}, got {}", flag, kMaxPlanCount, batch));
  }
  // A batch's bytes (8 per element at most, and its gradient) must stay far
  // inside int64, or LibTorch's size arithmetic overflows.
  constexpr int64_t kMaxBatchElements = INT64_MAX / 64;
  int64_t sample = 0;
  for (const auto& input : spec.inputs) {
    int64_t elements = 1;
    for (int64_t dim : input.shape) {
      if (__builtin_mul_overflow(elements, dim, &elements)) elements = INT64_MAX;
    }
    if (__builtin_add_overflow(sample, elements, &sample)) sample = INT64_MAX;
  }
  int64_t total = 0;
  if (__builtin_mul_overflow(batch, sample, &total) || total > kMaxBatchElements) {
    throw Error(fmt::format("{}: {} samples of {} elements each are more than {} elements; give "
                            "a smaller batch or input",
                            flag, batch, sample, kMaxBatchElements));
  }
}

std::vector<FileRole> workload_file_roles(const WorkloadFlags& flags) {
  const std::vector<std::string> builtin = builtin_model_names();
  const bool model_file =
      std::find(builtin.begin(), builtin.end(), flags.model) == builtin.end();
  return {{"--model", model_file ? flags.model : std::string(), FileAccess::kRead},
          {"--input-spec", flags.input_spec, FileAccess::kRead}};
}

void write_json_output(const std::string& target, const nlohmann::json& json) {
  // "-" is stdout, written and checked like a file: a full or closed
  // stdout is an error, not a silent exit 0.
  write_file_atomically(target, json.dump(2) + "\n");
}

}  // namespace batchtune::cli
