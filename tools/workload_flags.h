#pragma once

// The flags that say what is trained and where, shared by probe, tune and
// train, and what they resolve to.

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "batchtune/common/file_roles.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/workload.h"

namespace batchtune::cli {

/// LibTorch threads at most: more than any host's cores, and each one is a
/// thread the process must be able to start.
constexpr int kMaxThreads = 1024;
/// gpt's --layers, --heads and --width at most: far past any model that
/// trains on one device (the memory limit bounds the rest).
constexpr int64_t kMaxGptSize = 1 << 20;

struct WorkloadFlags {
  std::string model = "convnet";
  /// Empty: the model's default (3x64x64, or int64:64 for gpt).
  std::vector<std::string> inputs;
  int64_t vocab = 0;    ///< 0: none, or 256 for gpt
  int64_t classes = 0;  ///< 0: 10, or the vocabulary for token targets
  std::string target = "auto";
  std::string loss;
  std::string input_spec;
  int64_t layers = 2;
  int64_t heads = 2;
  int64_t width = 64;
  bool untied_head = false;
  std::string checkpointing = "off";
  std::string optimizer = "adam";
  double lr = 1e-3;
  uint64_t seed = 0;
  std::string device = "auto";
  std::string memory_limit;
  int threads = 0;
};

void add_workload_flags(CLI::App& app, WorkloadFlags& flags);

/// A workload ready to run on its device memory. The CPU budget counts the
/// model's bytes too: the allocator was installed before it was made.
struct ResolvedWorkload {
  std::unique_ptr<DeviceMemory> memory;
  std::unique_ptr<Workload> workload;
  int threads = 0;
};

/// The input spec the flags say (`--input-spec FILE`, or `--input` and
/// friends with the model's defaults); throws `batchtune::Error`.
InputSpec input_spec_from_flags(const WorkloadFlags& flags);

/// Checks every flag and builds the workload; throws `batchtune::Error`.
ResolvedWorkload resolve_workload(const WorkloadFlags& flags);

/// Checks that a batch of `batch` samples is a size the step can index:
/// at least 1, at most `kMaxPlanCount`, and its elements (batch × a
/// sample's) well inside int64. Throws `batchtune::Error` naming `flag`.
void check_batch_size(int64_t batch, const InputSpec& spec, const std::string& flag);

/// The files the workload flags read (`--model FILE`, `--input-spec`), for
/// `check_file_roles`.
std::vector<FileRole> workload_file_roles(const WorkloadFlags& flags);

/// Writes `json` to `target`: `-` for stdout, else a file, atomically.
void write_json_output(const std::string& target, const nlohmann::json& json);

}  // namespace batchtune::cli
