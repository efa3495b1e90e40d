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
  /// (or `--memory-limit` when smaller), or the CPU budget. On CUDA it counts
  /// all the device memory the process holds, the CUDA context and memory
  /// outside the caching allocator included (see `make_device_memory`).
  virtual int64_t capacity_bytes() const = 0;
  /// Sets how much of the capacity a trial may use (capacity less the
  /// margin). On CPU the emulated budget becomes this, so allocations past it
  /// fail; on CUDA the caching allocator's memory fraction is set to it less
  /// the memory outside the allocator and a headroom for its growth.
  virtual void set_usable_bytes(int64_t bytes) = 0;
  virtual int64_t usable_bytes() const = 0;
  /// Bytes held by live tensors now.
  virtual int64_t live_bytes() const = 0;
  /// Highest memory the device had to hold since `reset_peak()`: live bytes
  /// on CPU; on CUDA the caching allocator's peak reserved bytes plus the
  /// highest memory seen outside it (CUDA context, library workspaces, NCCL
  /// buffers), read at each `synchronize()`.
  virtual int64_t peak_bytes() const = 0;
  virtual void reset_peak() = 0;
  /// By how much the memory since `reset_peak()` went past what a trial may
  /// use; 0 when it stayed within. The peak less the usable bytes, by
  /// default; on CUDA the caching allocator's peak above its cap plus the
  /// growth outside it beyond `kCudaOutsideGrowthBytes`, so that neither
  /// can stand in for the other.
  virtual int64_t over_budget_bytes() const {
    return peak_bytes() > usable_bytes() ? peak_bytes() - usable_bytes() : 0;
  }
  /// By how much the tensors since `reset_peak()` went into the share of the
  /// allocator's cap kept for its fragmentation (`kCudaFragmentationReserve`,
  /// CUDA); 0 when they stayed out of it, and on CPU, whose budget does not
  /// fragment.
  virtual int64_t reserve_used_bytes() const { return 0; }
  /// Allocations the device's allocator has refused since it was made (the
  /// caching allocator's `num_ooms`, the budget allocator's refusals). A rise
  /// during a step means the step ran out of memory, whatever error it ended
  /// with (see `classify_step_failure`). 0 where nothing counts.
  virtual int64_t oom_count() const { return 0; }
  /// Returns cached, unused blocks to the device (CUDA `empty_cache`).
  virtual void release_cached() = 0;
  /// Waits for queued work on this memory's device (a no-op on CPU), so that
  /// a host clock read after it measures finished work.
  virtual void synchronize() = 0;
  /// Allocator statistics for people, as a few lines.
  virtual std::string summary() const = 0;
};

/// Memory of `device`. On CPU it installs the budget allocator if needed and
/// sets the budget to `limit`, or without one to `kDefaultCpuBudgetFraction`
/// of the RAM available now.
///
/// On CUDA it initialises LibTorch's CUDA state and the caching allocator
/// (so it may be made before any CUDA tensor), makes `device` the current
/// device of the calling thread, and reads the device's memory. `limit` then
/// means a GPU of that size: everything this process holds on the device
/// counts towards it — the caching allocator's reserved memory and what it
/// cannot see (the CUDA context, library workspaces, NCCL buffers, measured
/// as the device's used memory less the allocator's reserved) — as on a real
/// GPU of `limit` bytes. Memory other processes hold on the same GPU counts
/// too (it is not free for this one either). The caching allocator is capped
/// at the usable budget less that outside memory and
/// `kCudaOutsideGrowthBytes` of headroom for it to grow during a trial.
/// The outside memory is read again until the first step has run (kernels
/// load lazily, cuDNN and cuBLAS make their handles), then frozen once: every
/// later trial, and a `probe` in a fresh process after its first step, runs
/// under the same cap. When the memory object is destroyed the allocator's
/// previous memory fraction and the thread's previous current device come
/// back.
/// Throws `batchtune::Error` for a device that is not there.
std::unique_ptr<DeviceMemory> make_device_memory(const c10::Device& device,
                                                 std::optional<int64_t> limit);

/// Headroom kept off the caching allocator's cap on CUDA for memory outside
/// it that appears during a trial: kernels loaded lazily on first use, cuBLAS
/// and cuDNN handles for a new stream, NCCL's buffers at the first
/// collective. 256 MiB covers these for one process and one device (a CUDA
/// context with the kernels of a training step is some hundreds of MiB, and
/// is already counted when the memory object is made).
constexpr int64_t kCudaOutsideGrowthBytes = int64_t{256} << 20;

/// Share of the caching allocator's cap that a search's trials leave to the
/// allocator's fragmentation on CUDA (`TrialOptions::keep_fragmentation_reserve`).
/// Whether a step whose tensors need nearly all of the cap succeeds depends
/// on how the allocator's blocks happen to split, which differs from process
/// to process: on the first GPU run (an H200, ResNet-18 under a 3 GiB limit,
/// a cap of 1.70 GiB) a search found that batch 123 fits, twice, and a probe
/// of 123 in a fresh process ran out of memory with 1.65 GiB allocated and 18
/// to 48 MiB reserved but unusable; with this reserve the search found 118,
/// whose tensors' peak in a fresh process was 0.9 % above the search's.
constexpr double kCudaFragmentationReserve = 0.05;

/// Share of available RAM the CPU budget gets without `--memory-limit`: half,
/// so that the tool, its snapshots and the rest of the machine keep room.
constexpr double kDefaultCpuBudgetFraction = 0.5;

/// Parses `cpu`, `cuda` or `cuda:N` and checks that the device exists;
/// `auto` is CUDA device 0 where there is one, else the CPU.
c10::Device parse_device(const std::string& text);

}  // namespace batchtune
