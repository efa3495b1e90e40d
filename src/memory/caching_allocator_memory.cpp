#include "memory/caching_allocator_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "batchtune/common/error.h"
#include "batchtune/common/size.h"

namespace batchtune {
namespace {

class CachingAllocatorMemory final : public DeviceMemory {
 public:
  CachingAllocatorMemory(std::unique_ptr<CudaDeviceApi> device, std::optional<int64_t> limit)
      : device_(std::move(device)), total_(device_->total_bytes()) {
    if (limit && *limit <= 0) {
      throw Error(fmt::format("--memory-limit: must be positive, got {} bytes", *limit));
    }
    capacity_ = std::min<int64_t>(limit.value_or(total_), total_);
    outside_ = outside_now();
    outside_peak_ = outside_;
    if (outside_ + kCudaOutsideGrowthBytes >= capacity_) {
      throw Error(fmt::format(
          "{}: {} of cuda:{} leaves nothing for training: {} of the device is already used "
          "outside the caching allocator (CUDA context, other processes) and {} is kept for "
          "its growth; {}",
          limit ? "--memory-limit" : "--device", format_bytes(capacity_), device_->index(),
          format_bytes(outside_), format_bytes(kCudaOutsideGrowthBytes),
          limit ? "give a larger limit" : "free the GPU or use another device"));
    }
    set_usable_bytes(capacity_);
  }

  c10::Device device() const override {
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_->index()));
  }
  int64_t capacity_bytes() const override { return capacity_; }
  void set_usable_bytes(int64_t bytes) override {
    usable_ = std::min(bytes, capacity_);
    apply_cap();
  }
  int64_t usable_bytes() const override { return usable_; }
  int64_t live_bytes() const override { return device_->stats().allocated_current; }
  int64_t peak_bytes() const override { return device_->stats().reserved_peak + outside_peak_; }
  void reset_peak() override {
    device_->reset_peak_stats();
    // What lives outside the allocator grows with the first steps (kernels
    // loaded lazily, cuDNN and cuBLAS handles): the cap follows it until a
    // trial has run, then the baseline is frozen, so that every later trial
    // (and a probe of the answer) runs under the same cap. Growth after
    // that still counts in each trial's peak (see synchronize).
    if (!outside_frozen_) {
      outside_ = outside_now();
      outside_frozen_ = stepped_;
    }
    outside_peak_ = outside_;
    apply_cap();
  }
  int64_t oom_count() const override { return device_->stats().num_ooms; }
  void release_cached() override { device_->empty_cache(); }
  void synchronize() override {
    device_->synchronize();
    stepped_ = true;
    outside_peak_ = std::max(outside_peak_, outside_now());
  }
  std::string summary() const override {
    const AllocatorStats s = device_->stats();
    return fmt::format(
        "cuda:{} caching allocator\n  allocated {} (peak {})\n  reserved  {} (peak {})\n"
        "  outside   {} (peak {}; CUDA context, libraries, other processes)\n"
        "  usable    {} of {} (allocator capped at {})\n"
        "  out-of-memory events {}, cudaMalloc retries {}",
        device_->index(), format_bytes(s.allocated_current), format_bytes(s.allocated_peak),
        format_bytes(s.reserved_current), format_bytes(s.reserved_peak), format_bytes(outside_),
        format_bytes(outside_peak_), format_bytes(usable_), format_bytes(capacity_),
        format_bytes(allocator_budget()), s.num_ooms, s.num_alloc_retries);
  }

 private:
  /// Device memory in use that the caching allocator did not reserve.
  int64_t outside_now() const {
    return std::max<int64_t>(0, device_->used_bytes() - device_->stats().reserved_current);
  }
  int64_t allocator_budget() const {
    return std::max<int64_t>(0, usable_ - outside_ - kCudaOutsideGrowthBytes);
  }
  void apply_cap() { device_->set_memory_fraction(memory_fraction_for(allocator_budget(), total_)); }

  std::unique_ptr<CudaDeviceApi> device_;
  int64_t total_;
  int64_t capacity_ = 0;
  int64_t usable_ = 0;
  int64_t outside_ = 0;
  int64_t outside_peak_ = 0;
  bool stepped_ = false;         // a step has run (synchronize was called)
  bool outside_frozen_ = false;  // outside_ no longer re-read
};

}  // namespace

double memory_fraction_for(int64_t allocator_budget, int64_t total) {
  if (total <= 0 || allocator_budget <= 0) return 0;
  const double fraction = static_cast<double>(allocator_budget) / static_cast<double>(total);
  // LibTorch: a fraction of 1 removes the cap; just below it keeps one.
  return std::min(fraction, std::nextafter(1.0, 0.0));
}

std::unique_ptr<DeviceMemory> make_caching_allocator_memory(std::unique_ptr<CudaDeviceApi> device,
                                                            std::optional<int64_t> limit) {
  return std::make_unique<CachingAllocatorMemory>(std::move(device), limit);
}

}  // namespace batchtune
