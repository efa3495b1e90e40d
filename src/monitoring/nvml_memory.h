#pragma once

// Device memory read through NVML, which makes no CUDA context: how the
// device list (`batchtune env`, device parsing) learns each GPU's free memory
// without taking memory on every GPU.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace batchtune {

/// Free bytes of the devices with these PCI bus ids (`0000:3b:00.0`, as
/// `cudaDeviceGetPCIBusId` writes them), in the same order; each empty where
/// NVML does not load or does not know the device.
std::vector<std::optional<int64_t>> nvml_free_bytes(const std::vector<std::string>& pci_bus_ids);

}  // namespace batchtune
