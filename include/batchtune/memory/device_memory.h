#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace batchtune {

/// The memory of the device a workload trains on, seen the same way whether
/// it is a CUDA GPU (LibTorch's caching allocator) or the CPU (the emulated
/// byte budget of `BudgetAllocator`). Search and trial logic talk only to
/// this interface.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;

  /// The device this memory belongs to.
  virtual c10::Device device() const = 0;
  /// Everything the device has for this process: the GPU's total memory
  /// (or `--memory-limit` when smaller), or the CPU budget.
  virtual int64_t capacity_bytes() const = 0;
  /// Sets how much of the capacity a trial may use (capacity less the
  /// margin). On CPU the emulated budget becomes this, so allocations past it
  /// fail; on CUDA the caching allocator's memory fraction is set to it.
  virtual void set_usable_bytes(int64_t bytes) = 0;
  virtual int64_t usable_bytes() const = 0;
  /// Bytes held by live tensors now.
  virtual int64_t live_bytes() const = 0;
  /// Highest memory the device had to hold since `reset_peak()`: live bytes
  /// on CPU, reserved bytes of the caching allocator on CUDA (what counts
  /// towards an out-of-memory there).
  virtual int64_t peak_bytes() const = 0;
  virtual void reset_peak() = 0;
  /// Returns cached, unused blocks to the device (CUDA `empty_cache`).
  virtual void release_cached() = 0;
  /// Waits for queued work on the device (a no-op on CPU), so that a host
  /// clock read after it measures finished work.
  virtual void synchronize() = 0;
  /// Allocator statistics for people, as a few lines.
  virtual std::string summary() const = 0;
};

/// Memory of `device`. On CPU it installs the budget allocator if needed and
/// sets the budget to `limit`, or without one to `kDefaultCpuBudgetFraction`
/// of the RAM available now. On CUDA, `limit` caps the capacity.
/// Throws `batchtune::Error` for a device that is not there.
std::unique_ptr<DeviceMemory> make_device_memory(const c10::Device& device,
                                                 std::optional<int64_t> limit);

/// Share of available RAM the CPU budget gets without `--memory-limit`: half,
/// so that the tool, its snapshots and the rest of the machine keep room.
constexpr double kDefaultCpuBudgetFraction = 0.5;

/// Parses `cpu`, `cuda` or `cuda:N` and checks that the device exists;
/// `auto` is CUDA device 0 where there is one, else the CPU.
c10::Device parse_device(const std::string& text);

}  // namespace batchtune
