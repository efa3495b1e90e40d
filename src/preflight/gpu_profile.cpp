#include "batchtune/preflight/gpu_profile.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>

#include "batchtune/common/error.h"

namespace batchtune {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr double kGiB = double(int64_t{1} << 30);

int64_t gib(double g) { return static_cast<int64_t>(g * kGiB); }

/// The CUDA context with cuBLAS and cuDNN loaded, outside the allocator:
/// measured 527-749 MiB on an H200 with torch 2.11.0+cu130 and driver 580
/// (docs/gpu.md, `tests-cuda`). Other cards are given the same range: the
/// context grows with the kernels loaded more than with the card, and CUDA
/// 12+ loads modules lazily. An assumption, not a measurement, for them.
constexpr int64_t kContextLow = 527 * kMiB;
constexpr int64_t kContextHigh = 749 * kMiB;

/// PyTorch's default cuBLAS workspace (`CUBLAS_WORKSPACE_CONFIG` unset,
/// aten/src/ATen/cuda/CublasHandlePool.cpp): `:4096:8`, 32 MiB, on compute
/// capability 9.0 and up; `:4096:2:16:8`, 8 MiB + 128 KiB, below.
constexpr int64_t kCublasWorkspaceHopper = 4096 * 8 * 1024;
constexpr int64_t kCublasWorkspaceOlder = 4096 * 2 * 1024 + 16 * 8 * 1024;

struct Entry {
  const char* name;
  const char* description;
  double total_gib;
  bool hopper;
  const char* source;
};

// Totals are `total_memory` as PyTorch reports it (what its out-of-memory
// message calls "total capacity"), not the marketing figure.
const Entry kProfiles[] = {
    {"H100", "NVIDIA H100 80GB HBM3 (SXM)", 79.11, true,
     "total: 79.11 GiB in a PyTorch out-of-memory message on an H100 80GB (vllm-project/vllm#27508)"},
    {"H200", "NVIDIA H200 141GB HBM3e", 139.8, true,
     "total: 139.8 GiB measured here (docs/gpu.md, 2026-12-04)"},
    {"A100-80GB", "NVIDIA A100 80GB", 79.35, false,
     "total: 79.35 GiB in a PyTorch out-of-memory message on an A100 80GB "
     "(Instruction-Tuning-with-GPT-4/GPT-4-LLM#16)"},
    {"A100-40GB", "NVIDIA A100 40GB", 39.50, false,
     "total: 39.50 GiB in a PyTorch out-of-memory message on an A100 (TianheWu/CoSeR#10)"},
    {"L4", "NVIDIA L4 24GB", 22.05, false,
     "total: 24 GB GDDR6 by the vendor's spec less ECC and the driver's reserve: 22.05 GiB, "
     "recalled from PyTorch reports, not verified here"},
    {"A10G", "NVIDIA A10G 24GB", 21.99, false,
     "total: 24 GB GDDR6 by the vendor's spec less the driver's reserve: 21.99 GiB, recalled "
     "from PyTorch reports, not verified here"},
    {"RTX-4090", "NVIDIA GeForce RTX 4090 24GB", 23.65, false,
     "total: 24 GB GDDR6X by the vendor's spec less the driver's reserve: 23.65 GiB, recalled "
     "from PyTorch reports, not verified here"},
};

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  return s;
}

}  // namespace

std::vector<std::string> gpu_profile_names() {
  std::vector<std::string> names;
  for (const Entry& e : kProfiles) names.emplace_back(e.name);
  names.emplace_back("cpu");
  return names;
}

GpuProfile gpu_profile(const std::string& name, int64_t memory_limit) {
  const std::string wanted = upper(name);
  if (wanted == "CPU") {
    if (memory_limit <= 0) {
      throw Error("'cpu' is the emulated device: give its size (a memory limit such as 512MiB)");
    }
    GpuProfile p;
    p.name = "cpu";
    p.description = "the emulated device (a byte budget on the CPU)";
    p.total_bytes = memory_limit;
    p.source = "memory_limit as given; nothing is held outside the budget";
    p.emulated = true;
    return p;
  }
  for (const Entry& e : kProfiles) {
    if (upper(e.name) != wanted) continue;
    GpuProfile p;
    p.name = e.name;
    p.description = e.description;
    p.total_bytes = gib(e.total_gib);
    p.context_low = kContextLow;
    p.context_high = kContextHigh;
    p.cublas_workspace = e.hopper ? kCublasWorkspaceHopper : kCublasWorkspaceOlder;
    p.source = fmt::format(
        "{}; context 527-749 MiB measured on an H200 with torch 2.11.0+cu130 (docs/gpu.md){}; "
        "cuBLAS workspace PyTorch's default for compute capability {}",
        e.source, e.name == std::string("H200") ? "" : ", assumed the same here",
        e.hopper ? "9.0 (32 MiB)" : "below 9.0 (8.125 MiB)");
    return p;
  }
  std::vector<std::string> names = gpu_profile_names();
  throw Error(fmt::format("'{}' is not a GPU batchtune knows; use one of {}", name,
                          fmt::join(names, ", ")));
}

}  // namespace batchtune
