#pragma once

// The CUDA `DeviceMemory`, written against a small interface to the device
// so that its arithmetic (the allocator's cap, memory outside the allocator,
// the peak, the out-of-memory counter) is tested on the CPU with a fake.
// cuda_support.cpp holds the real device; it is built on every build that
// has CUDA, this file on every build.

#include <cstdint>
#include <memory>
#include <optional>

#include "batchtune/memory/device_memory.h"

namespace batchtune {

/// The caching allocator's counters for one device, in bytes.
struct AllocatorStats {
  int64_t allocated_current = 0;  ///< held by live tensors
  int64_t allocated_peak = 0;
  int64_t reserved_current = 0;   ///< taken from the device (cudaMalloc'd segments)
  int64_t reserved_peak = 0;
  int64_t num_ooms = 0;           ///< allocations it refused
  int64_t num_alloc_retries = 0;  ///< cudaMalloc retried after freeing its cache
};

/// What the CUDA memory reads and sets on one device.
class CudaDeviceApi {
 public:
  virtual ~CudaDeviceApi() = default;
  /// The CUDA device index.
  virtual int index() const = 0;
  /// `cudaDeviceProp::totalGlobalMem`: what the caching allocator multiplies
  /// its memory fraction by.
  virtual int64_t total_bytes() const = 0;
  /// Memory in use on the device now, by anyone (`cudaMemGetInfo`'s total
  /// less its free).
  virtual int64_t used_bytes() const = 0;
  virtual AllocatorStats stats() const = 0;
  /// `CUDACachingAllocator::setMemoryFraction` for this device: in [0, 1);
  /// 1 would mean no cap at all.
  virtual void set_memory_fraction(double fraction) = 0;
  /// The memory fraction set now (1 where none was: no cap).
  virtual double memory_fraction() const = 0;
  /// The calling thread's current CUDA device, and making one current
  /// (`restore`: the thread's earlier device, made current without creating
  /// a CUDA context on it where it has none yet).
  virtual int current_device() const = 0;
  virtual void set_current_device(int index, bool restore) = 0;
  virtual void reset_peak_stats() = 0;
  virtual void empty_cache() = 0;
  /// Waits for all work queued on this device.
  virtual void synchronize() = 0;
};

/// The caching allocator's memory fraction that caps its reserved bytes at
/// `allocator_budget`, on a device of `total` bytes (`totalGlobalMem`):
/// clamped to [0, 1), since LibTorch sets no cap at all for 1.
double memory_fraction_for(int64_t allocator_budget, int64_t total);

/// The CUDA `DeviceMemory` over `device` (see `make_device_memory` for what
/// `limit` means). Makes `device` the thread's current device. Reads the
/// memory outside the caching allocator when made, at each `reset_peak()`
/// (the start of a trial) and at each `synchronize()` (around each step);
/// at the end of the first step it freezes that baseline (see
/// `make_device_memory`). Destroyed, it sets back the memory fraction and the
/// current device it found.
std::unique_ptr<DeviceMemory> make_caching_allocator_memory(std::unique_ptr<CudaDeviceApi> device,
                                                            std::optional<int64_t> limit);

}  // namespace batchtune
