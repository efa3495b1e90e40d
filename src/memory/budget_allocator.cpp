#include "batchtune/memory/budget_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <new>
#include <cstring>

#include "batchtune/common/size.h"

namespace batchtune {
namespace {

// LibTorch aligns CPU memory to 64 bytes (c10::gAlignment); vectorised
// kernels rely on it.
constexpr size_t kAlignment = 64;
// Small blocks are rounded to this so that nearby sizes share cache entries.
constexpr size_t kSmallRounding = 512;
// Blocks above this are rounded to a coarser step, still well under 1 %.
constexpr size_t kLargeThreshold = size_t{1} << 20;
constexpr size_t kLargeRounding = size_t{64} << 10;
// The cache may hold the peak live bytes and this share more: a step's blocks
// over time are more than its peak at any moment (a batch freed before the
// activations peak). With the peak alone, the last of a convnet step's three
// 60 MiB blocks was freed and mapped again every step, and `train` ran at
// half the trial's speed.
constexpr double kCacheOverPeak = 0.25;
// Installed above LibTorch's own CPU allocator (priority 0).
constexpr uint8_t kInstallPriority = 100;

thread_local bool t_uncounted = false;

size_t round_up(size_t bytes) {
  const size_t step = bytes < kLargeThreshold ? kSmallRounding : kLargeRounding;
  return (bytes + step - 1) / step * step;
}

BudgetAllocator* g_installed = nullptr;

}  // namespace

BudgetAllocator& BudgetAllocator::install() {
  // Leaked on purpose: tensors may be freed during static destruction.
  static BudgetAllocator* instance = [] {
    auto* allocator = new BudgetAllocator();
    c10::SetCPUAllocator(allocator, kInstallPriority);
    g_installed = allocator;
    return allocator;
  }();
  return *instance;
}

BudgetAllocator* BudgetAllocator::installed() { return g_installed; }

c10::DataPtr BudgetAllocator::allocate(size_t bytes) {
  const c10::Device cpu(c10::DeviceType::CPU);
  if (bytes == 0) return {nullptr, nullptr, &free_block, cpu};
  const size_t capacity = round_up(bytes);
  const bool counted = !t_uncounted;
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (counted && live_bytes_ + static_cast<int64_t>(bytes) > budget_) {
      ++oom_count_;
      const int64_t live = live_bytes_;
      const int64_t budget = budget_;
      // The first sentence is the form of LibTorch's own CPU allocator, which
      // Python code that recognises an out-of-memory (PyTorch's, Lightning's,
      // accelerate's) matches on.
      TORCH_CHECK_WITH(OutOfMemoryError, false,
                       "DefaultCPUAllocator: can't allocate memory: you tried to allocate ",
                       bytes, " bytes. out of memory on the emulated device (cpu budget): "
                       "tried to allocate ", format_bytes(static_cast<int64_t>(bytes)), "; ",
                       format_bytes(live), " of ", format_bytes(budget), " already in use");
    }
    // The size's free list exists from the first block of that size on, so
    // that release() never has to make it. May throw bad_alloc: here that
    // is an allocation failing, which callers expect.
    void*& head = cache_[capacity];
    if (head != nullptr) {
      ptr = head;
      head = *static_cast<void**>(ptr);
      cached_bytes_ -= static_cast<int64_t>(capacity);
    }
  }
  if (ptr == nullptr) {
    ptr = std::aligned_alloc(kAlignment, capacity);
    if (ptr == nullptr) {
      std::lock_guard<std::mutex> lock(mutex_);
      release_cached_locked();
      ptr = std::aligned_alloc(kAlignment, capacity);
    }
    TORCH_CHECK_WITH(OutOfMemoryError, ptr != nullptr,
                     "out of host memory: tried to allocate ",
                     format_bytes(static_cast<int64_t>(capacity)));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    live_.emplace(ptr, Block{bytes, capacity, counted});
  } catch (const std::bad_alloc&) {
    std::free(ptr);
    TORCH_CHECK_WITH(OutOfMemoryError, false, "out of host memory: cannot track a block of ",
                     format_bytes(static_cast<int64_t>(capacity)));
  }
  if (counted) {
    live_bytes_ += static_cast<int64_t>(bytes);
    if (live_bytes_ > peak_bytes_) peak_bytes_ = live_bytes_;
  }
  return {ptr, ptr, &free_block, cpu};
}

void BudgetAllocator::free_block(void* ptr) {
  if (ptr != nullptr) g_installed->release(ptr);
}

// Runs inside tensors' destructors: it must neither allocate nor throw
// (a bad_alloc here would end the process). The cache is a free list per
// size threaded through the freed blocks themselves (each at least 512
// bytes), and the list's head was made when the size was first allocated.
void BudgetAllocator::release(void* ptr) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = live_.find(ptr);
  if (it == live_.end()) {
    std::fprintf(stderr, "BudgetAllocator: freeing a block it did not allocate\n");
    std::abort();
  }
  const Block block = it->second;
  live_.erase(it);
  if (block.counted) live_bytes_ -= static_cast<int64_t>(block.bytes);
  // The cache is bounded by the peak: what the process holds stays within
  // (2 + kCacheOverPeak) x what the workload itself needs.
  const auto capacity = static_cast<int64_t>(block.capacity);
  const auto head = cache_.find(block.capacity);
  const auto bound = static_cast<int64_t>(static_cast<double>(std::max(peak_bytes_, live_bytes_)) *
                                          (1 + kCacheOverPeak));
  if (caching_ && head != cache_.end() && cached_bytes_ + capacity <= bound) {
    *static_cast<void**>(ptr) = head->second;
    head->second = ptr;
    cached_bytes_ += capacity;
  } else {
    std::free(ptr);
  }
}

c10::DeleterFnPtr BudgetAllocator::raw_deleter() const { return &free_block; }

void BudgetAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  default_copy_data(dest, src, count);
}

void BudgetAllocator::set_budget(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  budget_ = bytes;
}

int64_t BudgetAllocator::budget() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return budget_;
}

int64_t BudgetAllocator::live_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_bytes_;
}

int64_t BudgetAllocator::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_bytes_;
}

void BudgetAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_bytes_ = live_bytes_;
}

int64_t BudgetAllocator::count_only(const std::unordered_set<const void*>& device) {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t host = 0;
  for (auto& [ptr, block] : live_) {
    if (!block.counted || device.count(ptr) > 0) continue;
    block.counted = false;
    host += static_cast<int64_t>(block.bytes);
  }
  live_bytes_ -= host;
  peak_bytes_ = live_bytes_;
  return host;
}

int64_t BudgetAllocator::oom_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return oom_count_;
}

int64_t BudgetAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_bytes_;
}

void BudgetAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

void BudgetAllocator::release_cached_locked() {
  // The lists' heads stay (as null) so that release() finds them.
  for (auto& [capacity, head] : cache_) {
    while (head != nullptr) {
      void* next = *static_cast<void**>(head);
      std::free(head);
      head = next;
    }
  }
  cached_bytes_ = 0;
}

void BudgetAllocator::set_caching(bool enabled) {
  std::lock_guard<std::mutex> lock(mutex_);
  caching_ = enabled;
  if (!enabled) release_cached_locked();
}

BudgetAllocator::UncountedScope::UncountedScope() : previous_(t_uncounted) {
  t_uncounted = true;
}

BudgetAllocator::UncountedScope::~UncountedScope() { t_uncounted = previous_; }

}  // namespace batchtune
