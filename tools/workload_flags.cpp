#include "workload_flags.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>

#include "batchtune/atomic_file.h"
#include "batchtune/environment.h"
#include "batchtune/error.h"
#include "batchtune/model.h"
#include "batchtune/shape.h"
#include "batchtune/size.h"

namespace batchtune::cli {

void add_workload_flags(CLI::App& app, WorkloadFlags& flags) {
  app.add_option("--model", flags.model,
                 fmt::format("model to train: {}", fmt::join(builtin_model_names(), ", ")))
      ->capture_default_str();
  app.add_option("--input", flags.input, "per-sample input shape, CxHxW")->capture_default_str();
  app.add_option("--classes", flags.classes, "number of classes")->capture_default_str();
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

ResolvedWorkload resolve_workload(const WorkloadFlags& flags) {
  if (flags.threads < 0) {
    throw Error(fmt::format("--threads: must be 0 (all cores) or more, got {}", flags.threads));
  }
  const auto shape = parse_shape(flags.input, "--input");
  if (flags.classes < 2) {
    throw Error(fmt::format("--classes: need at least 2 classes, got {}", flags.classes));
  }
  const c10::Device device = parse_device(flags.device);
  std::optional<int64_t> limit;
  if (!flags.memory_limit.empty()) limit = parse_size(flags.memory_limit, "--memory-limit");

  ResolvedWorkload resolved;
  resolved.threads = configure_threads(flags.threads);
  resolved.workload = std::make_unique<Workload>(WorkloadOptions()
                                                     .model(flags.model)
                                                     .input_shape(shape)
                                                     .classes(flags.classes)
                                                     .optimizer(flags.optimizer)
                                                     .lr(flags.lr)
                                                     .seed(flags.seed)
                                                     .device(device));
  const int64_t params = parameter_bytes(resolved.workload->model());
  if (limit && params >= *limit) {
    throw Error(fmt::format(
        "--memory-limit: {} cannot even hold the parameters of {} ({}); give a larger limit",
        format_bytes(*limit), resolved.workload->model().describe(), format_bytes(params)));
  }
  resolved.memory = make_device_memory(device, limit);
  return resolved;
}

void write_json_output(const std::string& target, const nlohmann::json& json) {
  if (target == "-") {
    std::cout << json.dump(2) << std::endl;
  } else {
    write_file_atomically(target, json.dump(2) + "\n");
  }
}

}  // namespace batchtune::cli
