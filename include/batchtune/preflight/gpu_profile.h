#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace batchtune {

/// What a GPU gives a training step's tensors, for an estimate made without
/// it: its memory as `cudaMemGetInfo` reports the total, what a PyTorch
/// process holds outside the caching allocator (the CUDA context with
/// cuBLAS's and cuDNN's handles and kernels loaded), as a range, and the
/// cuBLAS workspace, which PyTorch takes from the caching allocator once per
/// handle and keeps. `source` says where the figures come from.
///
/// The `cpu` profile stands for the emulated device: its memory is the
/// `memory_limit` asked for, with nothing outside it.
struct GpuProfile {
  /// The short name: `H100`, `H200`, `A100-80GB`, `cpu`.
  std::string name;
  /// The card in words: "NVIDIA H100 80GB HBM3 (SXM)".
  std::string description;
  /// Total memory as `torch.cuda.get_device_properties().total_memory`.
  int64_t total_bytes = 0;
  /// Memory outside the allocator once a training step has run: low, high.
  int64_t context_low = 0;
  int64_t context_high = 0;
  /// cuBLAS's workspace (inside the allocator, one block, held for good).
  int64_t cublas_workspace = 0;
  /// Where the figures come from.
  std::string source;
  /// Whether this is the emulated CPU device.
  bool emulated = false;

  /// What the caching allocator may take at most: the total less the
  /// context at its high end (conservative) or its low end (optimistic).
  int64_t allocator_capacity(bool conservative = true) const {
    return total_bytes - (conservative ? context_high : context_low);
  }
};

/// The profile named `name` (case-insensitive: `h100`, `H100`). `cpu` needs
/// `memory_limit` (bytes, > 0): the emulated device's size. Throws
/// `batchtune::Error` naming the input and listing the known names for an
/// unknown one, and for `cpu` without a limit; the front end puts its own
/// name of the input before the message (`--gpu: `, `device: `).
///
/// Example:
/// ```
///   auto h100 = batchtune::gpu_profile("H100");
///   h100.allocator_capacity();   // 79.11 GiB less 749 MiB
/// ```
GpuProfile gpu_profile(const std::string& name, int64_t memory_limit = 0);

/// The names `gpu_profile` knows, `cpu` last.
std::vector<std::string> gpu_profile_names();

}  // namespace batchtune
