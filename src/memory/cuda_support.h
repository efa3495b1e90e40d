#pragma once

// What batchtune needs from CUDA, in one place. Two implementations:
// cuda_support.cpp (built when LibTorch has CUDA) and cuda_support_stub.cpp.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/memory/device_memory.h"
#include "batchtune/monitoring/environment.h"

namespace batchtune::cuda {

/// Whether this build of batchtune has its CUDA paths compiled in.
bool compiled();
/// CUDA devices present, or none with `reason` saying why.
std::vector<GpuInfo> devices(std::string* reason);
/// PCI bus id of CUDA device `index` (`0000:3b:00.0`), or empty.
std::string pci_bus_id(int index);
/// CUDA driver version as "13.0", or empty.
std::string driver_version();
/// Memory of CUDA device `index` (caching-allocator statistics).
std::unique_ptr<DeviceMemory> make_memory(int index, std::optional<int64_t> limit);

}  // namespace batchtune::cuda
