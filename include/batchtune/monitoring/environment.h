#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace batchtune {

/// One CUDA device as `batchtune env` reports it.
struct GpuInfo {
  int index = 0;
  std::string name;
  int64_t total_bytes = 0;
  /// Free memory as NVML reads it (no CUDA context is made to list the
  /// devices); empty where NVML does not load.
  std::optional<int64_t> free_bytes;
  int compute_major = 0;
  int compute_minor = 0;
};

/// What batchtune can see of the machine: the same fields on a CPU-only
/// machine, with the reason where something is missing.
struct Environment {
  std::string torch_version;
  bool torch_cuda = false;          ///< this build has the CUDA paths
  bool cuda_available = false;      ///< at least one CUDA device can be used
  std::string cuda_reason;          ///< why not, when not
  std::string cuda_driver;          ///< driver's CUDA version, empty when none
  std::vector<GpuInfo> gpus;
  bool nvml_available = false;
  std::string nvml_reason;          ///< why not, when not
  std::string cpu_model;
  int cpu_cores = 0;                ///< logical cores this process may use
  int threads = 0;                  ///< LibTorch intra-op threads in use
  int64_t ram_total_bytes = 0;
  int64_t ram_available_bytes = 0;
};

/// Reads the environment. Never throws for missing hardware.
Environment collect_environment();

/// Logical cores this process may run on (its CPU affinity).
int available_cores();

/// Sets LibTorch's intra-op threads: `threads` > 0 exactly, 0 for all cores
/// (LibTorch's own default has been half of them). Returns the count set.
int configure_threads(int threads);

/// `MemTotal` and `MemAvailable` of /proc/meminfo, in bytes.
int64_t ram_total_bytes();
int64_t ram_available_bytes();

}  // namespace batchtune
