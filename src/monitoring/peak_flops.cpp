#include "batchtune/monitoring/peak_flops.h"

#include <ATen/Context.h>
#include <fmt/format.h>

#include <array>

#include "memory/cuda_support.h"

namespace batchtune {
namespace {

/// One row of the datasheets: dense TFLOP/s (sparsity's doubled figures
/// halved), fp16 as bf16. `match`: a part of CUDA's device name; the first
/// row that matches wins, so the more specific names come first.
struct Datasheet {
  const char* match;
  double fp32;  ///< CUDA cores
  double tf32;  ///< tensor cores
  double bf16;  ///< tensor cores, and fp16
  const char* source;
};

constexpr std::array<Datasheet, 9> kDatasheets{{
    {"H200 NVL", 60, 417.5, 835.5, "NVIDIA H200 datasheet (H200 NVL), 2024"},
    {"H200", 67, 494.5, 989.5, "NVIDIA H200 datasheet (H200 SXM), 2024"},
    {"H100 NVL", 60, 417.5, 835.5, "NVIDIA H100 datasheet (H100 NVL), 2023"},
    {"H100 PCIe", 51, 378, 756, "NVIDIA H100 datasheet (H100 PCIe), 2023"},
    {"H100", 67, 494.5, 989.5, "NVIDIA H100 datasheet (H100 SXM), 2023"},
    {"A100", 19.5, 156, 312, "NVIDIA A100 datasheet, 2021"},
    {"L40S", 91.6, 183, 362, "NVIDIA L40S datasheet, 2023"},
    {"L4", 30.3, 60, 121, "NVIDIA L4 datasheet, 2023"},
    {"A10", 31.2, 62.5, 125, "NVIDIA A10 datasheet, 2021"},
}};

}  // namespace

std::optional<PeakFlops> peak_flops(const std::string& gpu_name, AmpMode amp, bool tf32) {
  for (const Datasheet& d : kDatasheets) {
    if (gpu_name.find(d.match) == std::string::npos) continue;
    PeakFlops peak;
    peak.gpu = gpu_name;
    peak.source = d.source;
    if (amp == AmpMode::kBf16 || amp == AmpMode::kFp16) {
      peak.flops_per_s = d.bf16 * 1e12;
      peak.precision = amp == AmpMode::kBf16 ? "bf16" : "fp16";
    } else {
      peak.flops_per_s = (tf32 ? d.tf32 : d.fp32) * 1e12;
      peak.precision = tf32 ? "tf32" : "fp32";
    }
    return peak;
  }
  return std::nullopt;
}

std::optional<PeakFlops> device_peak_flops(c10::Device device, AmpMode amp, std::string* why) {
  if (!device.is_cuda()) {
    *why = "no peak for the CPU: model FLOPs utilization is given for GPUs";
    return std::nullopt;
  }
  std::string reason;
  const std::vector<GpuInfo> gpus = cuda::devices(&reason);
  const int index = device.has_index() ? device.index() : 0;
  if (index >= static_cast<int>(gpus.size())) {
    *why = fmt::format("no name for {} ({})", device.str(), reason);
    return std::nullopt;
  }
  auto peak = peak_flops(gpus[index].name, amp, at::globalContext().allowTF32CuBLAS());
  if (!peak) {
    *why = fmt::format("no datasheet peak for \"{}\" in batchtune's table "
                       "(src/monitoring/peak_flops.cpp)",
                       gpus[index].name);
  }
  return peak;
}

}  // namespace batchtune
