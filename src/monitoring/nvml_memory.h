#pragma once

// Device memory read through NVML, which makes no CUDA context: how the
// device list (`batchtune env`, device parsing) learns each GPU's free memory
// without taking memory on every GPU.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "monitoring/nvml_api.h"

namespace batchtune {

/// A device's memory as NVML reports it, in bytes.
struct NvmlMemoryReading {
  int64_t total = 0;
  int64_t free = 0;
  /// What processes allocated, as `nvidia-smi` shows it: version 2's `used`,
  /// which leaves out the memory the driver reserves for itself (about 0.5
  /// to 1 GiB on recent drivers, counted in version 1's `used`).
  int64_t used = 0;
};

/// Reads `device`'s memory through `nvmlDeviceGetMemoryInfo_v2` where the
/// library has it (`v2` not null) and the driver takes it, else through the
/// version 1 call. Returns NVML's code; `out` is set on success.
nvml::Return read_nvml_memory(nvml::Device device, nvml::DeviceGetMemoryInfoV2Fn v2,
                              nvml::DeviceGetMemoryInfoFn v1, NvmlMemoryReading* out);

/// Free bytes of the devices with these PCI bus ids (`0000:3b:00.0`, as
/// `cudaDeviceGetPCIBusId` writes them), in the same order; each empty where
/// NVML does not load or does not know the device.
std::vector<std::optional<int64_t>> nvml_free_bytes(const std::vector<std::string>& pci_bus_ids);

}  // namespace batchtune
