#pragma once

// The few parts of NVML's C API that batchtune calls, declared here because
// no NVML header is packaged in Debian's main repository. Layouts and values
// as in NVIDIA's nvml.h (stable across driver releases); the functions are
// looked up at run time in libnvidia-ml.so.1 (see nvml_sampler.cpp).

namespace batchtune::nvml {

using Return = int;  // nvmlReturn_t
constexpr Return kSuccess = 0;            // NVML_SUCCESS
constexpr Return kErrorNotSupported = 3;  // NVML_ERROR_NOT_SUPPORTED
constexpr Return kErrorFunctionNotFound = 13;         // NVML_ERROR_FUNCTION_NOT_FOUND
constexpr Return kErrorArgumentVersionMismatch = 25;  // NVML_ERROR_ARGUMENT_VERSION_MISMATCH

struct DeviceStruct;                 // opaque
using Device = DeviceStruct*;        // nvmlDevice_t

struct Utilization {                 // nvmlUtilization_t
  unsigned int gpu;                  // % of the last period in which a kernel ran
  unsigned int memory;               // % of it in which device memory was read or written
};

struct Memory {                      // nvmlMemory_t (version 1)
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;           // counts the driver's reserved memory too
};

struct MemoryV2 {                    // nvmlMemory_v2_t (drivers from R510)
  unsigned int version;              // kMemoryV2Version
  unsigned long long total;
  unsigned long long reserved;       // the driver's own (firmware, ECC, page tables)
  unsigned long long free;
  unsigned long long used;           // allocated by processes: what nvidia-smi shows
};
static_assert(sizeof(MemoryV2) == 40, "nvmlMemory_v2_t is 40 bytes");
// NVML_STRUCT_VERSION(Memory, 2): the struct's size, the version in the top byte.
constexpr unsigned int kMemoryV2Version = static_cast<unsigned int>(sizeof(MemoryV2)) | (2U << 24U);

using InitFn = Return (*)();                                               // nvmlInit_v2
using ShutdownFn = Return (*)();                                           // nvmlShutdown
using ErrorStringFn = const char* (*)(Return);                             // nvmlErrorString
using DeviceGetCountFn = Return (*)(unsigned int*);                        // nvmlDeviceGetCount_v2
using DeviceGetHandleByIndexFn = Return (*)(unsigned int, Device*);        // ..._v2
using DeviceGetHandleByPciBusIdFn = Return (*)(const char*, Device*);      // ..._v2
using DeviceGetUtilizationRatesFn = Return (*)(Device, Utilization*);
using DeviceGetMemoryInfoFn = Return (*)(Device, Memory*);
using DeviceGetMemoryInfoV2Fn = Return (*)(Device, MemoryV2*);             // ..._v2
using DeviceGetPowerUsageFn = Return (*)(Device, unsigned int*);           // milliwatts
using DeviceGetTotalEnergyConsumptionFn = Return (*)(Device, unsigned long long*);  // mJ

}  // namespace batchtune::nvml
