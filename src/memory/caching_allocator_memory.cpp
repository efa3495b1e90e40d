#include "memory/caching_allocator_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/common/size.h"

namespace batchtune {
namespace {

class CachingAllocatorMemory final : public DeviceMemory {
 public:
  CachingAllocatorMemory(std::unique_ptr<CudaDeviceApi> device, std::optional<int64_t> limit)
      : device_(std::move(device)), total_(device_->total_bytes()) {
    if (limit && *limit <= 0) {
      throw OptionError(Option::kMemoryLimit, fmt::format("must be positive, got {} bytes", *limit));
    }
    previous_fraction_ = device_->memory_fraction();
    previous_device_ = device_->current_device();
    capacity_ = std::min<int64_t>(limit.value_or(total_), total_);
    outside_ = outside_now();
    outside_peak_ = outside_;
    if (outside_ + kCudaOutsideGrowthBytes >= capacity_) {
      const std::string detail = fmt::format(
          "{} of cuda:{} leaves nothing for training: {} of the device is already used outside "
          "the caching allocator (CUDA context, other processes) and {} is kept for its growth; "
          "{}",
          format_bytes(capacity_), device_->index(), format_bytes(outside_),
          format_bytes(kCudaOutsideGrowthBytes),
          limit ? "give a larger " + mention(Option::kMemoryLimit)
                : std::string("free the GPU or use another device"));
      if (limit) throw OptionError(Option::kMemoryLimit, detail);
      throw OptionError(Option::kDevice, detail);
    }
    // Every later call on this thread (the model, the step, the
    // synchronisation) runs on this device, and no other device gets a
    // context.
    device_->set_current_device(device_->index(), /*restore=*/false);
    set_usable_bytes(capacity_);
  }

  ~CachingAllocatorMemory() override {
    // A tune's cap is the tune's: the rest of the process gets the allocator
    // and the device it had. Nothing may throw here (a process exiting may
    // have torn CUDA down already).
    try {
      device_->set_memory_fraction(previous_fraction_);
      if (previous_device_ != device_->index()) {
        device_->set_current_device(previous_device_, /*restore=*/true);
      }
    } catch (...) {
    }
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
    syncs_since_reset_ = 0;
    if (!outside_frozen_) outside_ = outside_now();
    outside_peak_ = outside_;
    apply_cap();
  }
  int64_t over_budget_bytes() const override {
    // The allocator past its cap (blocks it reserved before the cap was
    // lowered) and the outside memory past its headroom are each over:
    // unused headroom does not excuse a reservation above the cap.
    const int64_t reserved_over = device_->stats().reserved_peak - allocator_budget();
    const int64_t outside_over = outside_peak_ - outside_ - kCudaOutsideGrowthBytes;
    return std::max<int64_t>(0, reserved_over) + std::max<int64_t>(0, outside_over);
  }
  int64_t reserve_used_bytes() const override {
    // Judged by the tensors' peak, which the blocks' split does not change.
    const auto allowed = static_cast<int64_t>((1 - kCudaFragmentationReserve) *
                                              static_cast<double>(allocator_budget()));
    return std::max<int64_t>(0, device_->stats().allocated_peak - allowed);
  }
  int64_t oom_count() const override { return device_->stats().num_ooms; }
  void release_cached() override { device_->empty_cache(); }
  void synchronize() override {
    device_->synchronize();
    const int64_t outside = outside_now();
    // The trial runner synchronizes before and after each step: the second
    // call since reset_peak ends the first step.
    if (!outside_frozen_ && ++syncs_since_reset_ >= 2) freeze_outside(outside);
    outside_peak_ = std::max(outside_peak_, outside);
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

  // What lives outside the allocator grows with the first step (kernels
  // loaded lazily, cuDNN and cuBLAS handles). After it the baseline is read
  // once and kept, so that every later step, every later trial and a probe
  // in a fresh process run under one cap; growth after that counts in each
  // trial's peak, against the headroom. The blocks the first step cached
  // under the earlier, larger cap go back to the device and the peak starts
  // again, so that the rest of the trial allocates under the frozen cap.
  void freeze_outside(int64_t outside) {
    outside_frozen_ = true;
    outside_ = outside;
    apply_cap();
    device_->empty_cache();
    device_->reset_peak_stats();
  }

  std::unique_ptr<CudaDeviceApi> device_;
  int64_t total_;
  int64_t capacity_ = 0;
  int64_t usable_ = 0;
  int64_t outside_ = 0;
  int64_t outside_peak_ = 0;
  int syncs_since_reset_ = 0;    // synchronize calls since the trial began
  bool outside_frozen_ = false;  // outside_ no longer re-read
  double previous_fraction_ = 1;
  int previous_device_ = 0;
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
