#pragma once

#include <c10/core/Allocator.h>

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace batchtune {

/// The CPU stand-in for a GPU's memory: an allocator that every CPU tensor
/// goes through once it is installed, which counts live and peak bytes and
/// throws `c10::OutOfMemoryError` (the error CUDA raises) when an allocation
/// would take the live bytes past the budget.
///
/// It also caches freed blocks by size, as the CUDA caching allocator does:
/// a training step allocates the same sizes every time, and handing them back
/// to glibc made every step pay page faults (2-5x slower training here).
/// Cached blocks do not count against the budget; `release_cached()` frees
/// them and the cache never holds more than 1.25 x the peak live bytes.
///
/// Install it before any tensor is made; tensors made before are not counted.
///
/// Example:
/// ```
///   auto& budget = batchtune::BudgetAllocator::install();
///   budget.set_budget(512 << 20);
///   budget.reset_peak();
///   // ... run a training step ...
///   int64_t peak = budget.peak_bytes();
/// ```
class BudgetAllocator final : public c10::Allocator {
 public:
  /// Budget value meaning "no limit".
  static constexpr int64_t kUnlimited = INT64_MAX;

  /// Installs the process-wide instance as LibTorch's CPU allocator (once)
  /// and returns it.
  static BudgetAllocator& install();

  /// The installed instance; null before `install()`.
  static BudgetAllocator* installed();

  c10::DataPtr allocate(size_t bytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  /// Sets the budget in bytes (`kUnlimited` for none). Allocations already
  /// live stay; the next one that would pass the budget throws.
  void set_budget(int64_t bytes);
  int64_t budget() const;

  /// Bytes of live, counted allocations.
  int64_t live_bytes() const;
  /// Highest `live_bytes()` since the last `reset_peak()`.
  int64_t peak_bytes() const;
  /// Sets the peak to the current live bytes.
  void reset_peak();
  /// Number of allocations refused since install.
  int64_t oom_count() const;
  /// Bytes held in the cache of freed blocks.
  int64_t cached_bytes() const;
  /// Frees every cached block back to the system.
  void release_cached();
  /// Turns the cache of freed blocks on or off (on by default). Off frees
  /// every block at once, as glibc's allocator would.
  void set_caching(bool enabled);

  /// Stops counting every live block but those in `device` (the data
  /// pointers of what the emulated device holds: a model's parameters and
  /// optimizer state) and returns the bytes it stopped counting. What else a
  /// process holds when a tune or probe starts (its data, another test's
  /// tensors, garbage not yet collected) is host memory, as it would be
  /// beside a GPU; counted, it made one tune's answer depend on what ran
  /// before it in the process. Their frees then count nothing.
  int64_t count_only(const std::unordered_set<const void*>& device);

  /// While one of these lives, allocations made on this thread are not
  /// counted against the budget: for host-side copies that belong to the
  /// tool (a trial's snapshot), not to the emulated device.
  class UncountedScope {
   public:
    UncountedScope();
    ~UncountedScope();
    UncountedScope(const UncountedScope&) = delete;
    UncountedScope& operator=(const UncountedScope&) = delete;

   private:
    bool previous_;
  };

 private:
  BudgetAllocator() = default;
  static void free_block(void* ptr);
  void release(void* ptr) noexcept;
  void release_cached_locked();

  struct Block {
    size_t bytes;     // what the caller asked for: what the budget counts
    size_t capacity;  // what was allocated, the cache key
    bool counted;
  };

  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> live_;
  /// Freed blocks by capacity: the head of a list linked through the
  /// blocks' first bytes (null when empty).
  std::unordered_map<size_t, void*> cache_;
  int64_t budget_ = kUnlimited;
  int64_t live_bytes_ = 0;
  int64_t peak_bytes_ = 0;
  int64_t cached_bytes_ = 0;
  int64_t oom_count_ = 0;
  bool caching_ = true;
};

}  // namespace batchtune
