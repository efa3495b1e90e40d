#pragma once

// What batchtune needs from CUDA, in one place. Two implementations:
// cuda_support.cpp (built when LibTorch has CUDA) and cuda_support_stub.cpp.

#include <ATen/core/Tensor.h>

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
/// CUDA devices present, or none with `reason` saying why. Makes no CUDA
/// context: names and sizes from the device properties, free memory from
/// NVML where it loads (else empty).
std::vector<GpuInfo> devices(std::string* reason);
/// PCI bus id of CUDA device `index` (`0000:3b:00.0`), or empty.
std::string pci_bus_id(int index);
/// CUDA driver version as "13.0", or empty.
std::string driver_version();
/// Memory of CUDA device `index` (see `make_device_memory`): initialises
/// LibTorch's CUDA state and makes `index` the calling thread's device.
std::unique_ptr<DeviceMemory> make_memory(int index, std::optional<int64_t> limit);
/// Makes `index` the calling thread's current CUDA device (before a process
/// group is made, so that NCCL and its watchdog use that device).
void set_current_device(int index);
/// State of the default CUDA random generator of device `index` (a CPU
/// tensor), and setting it back; only for a device that is in use.
at::Tensor generator_state(int index);
void set_generator_state(int index, const at::Tensor& state);

}  // namespace batchtune::cuda
