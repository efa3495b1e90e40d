#pragma once

#include <c10/core/Device.h>

#include <optional>
#include <string>

#include "batchtune/common/precision.h"

namespace batchtune {

/// A GPU's peak dense FLOP/s at one precision (tensor cores where the
/// precision uses them, no sparsity), from its vendor's datasheet: what
/// model FLOPs utilization (MFU) divides achieved FLOP/s by.
struct PeakFlops {
  double flops_per_s = 0;
  std::string gpu;        ///< the name as CUDA gives it, "NVIDIA H200"
  std::string precision;  ///< "bf16", "fp16", "tf32" or "fp32"
  std::string source;     ///< where the figure comes from
};

/// The peak of the GPU named `gpu_name` (as CUDA names it) for a step at
/// `amp`: bf16 and fp16 at their tensor-core peak; fp32 at TF32's where
/// `tf32` (matrix products allowed TF32), else the CUDA cores' fp32 peak.
/// nullopt for a GPU the table does not know.
///
/// Example:
/// ```
///   batchtune::peak_flops("NVIDIA H200", batchtune::AmpMode::kBf16, false)->flops_per_s;  // 989.5e12
/// ```
std::optional<PeakFlops> peak_flops(const std::string& gpu_name, AmpMode amp, bool tf32);

/// The peak of `device` as the step at `amp` runs on it now (the GPU's name
/// from CUDA, TF32 as LibTorch's matmul setting says); nullopt with `why`
/// set for the CPU, a GPU not in the table, or no CUDA.
std::optional<PeakFlops> device_peak_flops(c10::Device device, AmpMode amp, std::string* why);

}  // namespace batchtune
