#pragma once

// A DeviceMemory for tests: the CPU budget memory, with an out-of-memory
// counter the test drives (as a caching allocator's num_ooms rises when a
// library swallows its out-of-memory and throws its own error).

#include <memory>

#include "batchtune/memory/device_memory.h"

namespace batchtune::testing {

class CountingMemory final : public DeviceMemory {
 public:
  explicit CountingMemory(std::unique_ptr<DeviceMemory> inner) : inner_(std::move(inner)) {}

  /// What an allocator does when it refuses an allocation.
  void count_oom() { ++ooms_; }
  /// What a CUDA allocator reports when the tensors went into the share of
  /// its cap kept for fragmentation.
  void set_reserve_used(int64_t bytes) { reserve_used_ = bytes; }

  c10::Device device() const override { return inner_->device(); }
  int64_t capacity_bytes() const override { return inner_->capacity_bytes(); }
  void set_usable_bytes(int64_t bytes) override { inner_->set_usable_bytes(bytes); }
  int64_t usable_bytes() const override { return inner_->usable_bytes(); }
  int64_t live_bytes() const override { return inner_->live_bytes(); }
  int64_t peak_bytes() const override { return inner_->peak_bytes(); }
  void reset_peak() override { inner_->reset_peak(); }
  int64_t over_budget_bytes() const override { return inner_->over_budget_bytes(); }
  int64_t reserve_used_bytes() const override { return reserve_used_; }
  int64_t oom_count() const override { return ooms_; }
  void release_cached() override { inner_->release_cached(); }
  void synchronize() override { inner_->synchronize(); }
  std::string summary() const override { return inner_->summary(); }

 private:
  std::unique_ptr<DeviceMemory> inner_;
  int64_t ooms_ = 0;
  int64_t reserve_used_ = 0;
};

}  // namespace batchtune::testing
