#pragma once

// The flags that say what is trained and where, shared by probe, tune and
// train, and what they resolve to.

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "batchtune/device_memory.h"
#include "batchtune/workload.h"

namespace batchtune::cli {

struct WorkloadFlags {
  std::string model = "convnet";
  std::string input = "3x64x64";
  int64_t classes = 10;
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

/// Checks every flag and builds the workload; throws `batchtune::Error`.
ResolvedWorkload resolve_workload(const WorkloadFlags& flags);

/// Writes `json` to `target`: `-` for stdout, else a file, atomically.
void write_json_output(const std::string& target, const nlohmann::json& json);

}  // namespace batchtune::cli
