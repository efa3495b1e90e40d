#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "batchtune/preflight/caching_allocator_model.h"
#include "batchtune/preflight/gpu_profile.h"

namespace batchtune {

/// The share of the allocator's memory the low end of an estimate leaves to
/// what a traced step cannot show: cuDNN's and cuBLASLt's workspaces chosen
/// at run time, a custom kernel's own allocations, NCCL's buffers (5 %: the
/// share a CUDA search already keeps for the allocator's fragmentation,
/// `kCudaFragmentationReserve`; more than the cuDNN workspaces ResNet-50
/// asked at its largest batch on an H200, docs/benchmarks.md).
constexpr double kUnseenShare = 0.05;
/// The search doubles up to this batch at most: a million samples is a typo.
constexpr int64_t kMaxEstimateBatch = int64_t{1} << 20;

/// What the allocator may take on `profile`, at the two ends of an estimate,
/// with `margin` of it kept free as a trial keeps it (`kDefaultMargin`).
/// Low: the card less the context at its high end, less the margin, less
/// `kUnseenShare`. High: the card less the context at its low end, less the
/// margin. On the emulated device (`cpu`): the budget less the margin, and
/// the low end less `kUnseenShare` for what the CPU's kernels allocate on
/// their own.
struct EstimateCapacity {
  int64_t low = 0;
  int64_t high = 0;
};
EstimateCapacity estimate_capacity(const GpuProfile& profile, double margin);

/// A traced step's fit on `profile` under `capacity` bytes: on a GPU its
/// trace replayed through `CachingAllocatorModel`, after cuBLAS's workspace
/// (taken from the allocator once and kept); on the emulated device, which
/// holds tensors byte for byte, whether the tensors' peak fits.
AllocatorReplay replay_on(const AllocationTrace& trace, const GpuProfile& profile, int64_t capacity);

/// One batch size the search tried, at one end.
struct EstimateTrial {
  int64_t batch_size = 0;
  int64_t capacity = 0;
  bool fits = false;
  int64_t peak_reserved = 0;
  int64_t peak_requested = 0;
};

/// The largest batch that fits at each end of the estimate, and the trials.
struct BatchEstimate {
  int64_t low = 0;
  int64_t high = 0;
  EstimateCapacity capacity;
  std::vector<EstimateTrial> trials;
};

/// The largest batch whose traced step fits `profile`, at both ends of
/// `estimate_capacity`: from batch 2 (a model with batch norm cannot train on
/// one sample), doubling to `max_batch` at most until a batch does not fit,
/// then bisecting; 1 when 2 does not fit but 1 does, 0 when neither.
/// `trace_at(n)` traces the step at batch `n` (called once per batch: the
/// two ends share the traces). Throws `batchtune::Error` for a margin outside
/// [0, kMaxMargin] or `max_batch` outside [1, kMaxEstimateBatch].
///
/// Example:
/// ```
///   auto profile = batchtune::gpu_profile("H100");
///   auto e = batchtune::estimate_largest_batch(
///       [&](int64_t n) { return my_trace(n); }, profile, batchtune::kDefaultMargin);
///   e.low;   // the batch to use
/// ```
BatchEstimate estimate_largest_batch(const std::function<AllocationTrace(int64_t)>& trace_at,
                                     const GpuProfile& profile, double margin,
                                     int64_t max_batch = kMaxEstimateBatch);

/// The device's memory at a step's peak, by what holds it.
struct MemoryBreakdown {
  /// `parameters`, `gradients`, `optimizer_state`, `activations`,
  /// `temporaries` (the tensors live at the tensors' peak, by the trace's
  /// category of each; one with none is a temporary), `workspaces`
  /// (cuBLAS's), `allocator_overhead` (the allocator's peak reservation
  /// beyond the tensors and workspace: rounding, split blocks, segments
  /// cached for reuse) and `context` (outside the allocator, its high end).
  /// On the emulated device only the tensors'.
  std::map<std::string, int64_t> bytes;
  /// The tensors' peak: the bytes they asked for.
  int64_t tensor_peak = 0;
  /// On a GPU the allocator's peak reservation (`max_memory_reserved`); on
  /// the emulated device the tensors' peak (what a probe reports).
  int64_t peak_bytes = 0;
  /// Whether the step fits `capacity`.
  bool fits = false;
};

/// The breakdown of `trace` on `profile` under `capacity` bytes, with
/// `category` saying what each storage id is.
MemoryBreakdown breakdown_at_peak(const AllocationTrace& trace,
                                  const std::map<int64_t, std::string>& category,
                                  const GpuProfile& profile, int64_t capacity);

/// The breakdown's keys, in the order they are shown.
std::vector<std::string> breakdown_keys();

}  // namespace batchtune
