#include "batchtune/preflight/caching_allocator_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "batchtune/common/error.h"

namespace batchtune {
namespace {

struct Block {
  int64_t address = 0;
  int64_t size = 0;
  int64_t requested = 0;
  bool allocated = false;
  bool small = false;
  /// Neighbours within the segment (null at its ends), as the real
  /// allocator's `prev`/`next`.
  Block* prev = nullptr;
  Block* next = nullptr;
};

/// Best fit: the smallest block that holds the request, the lowest address
/// among equals (`BlockComparatorSize`, one stream).
struct BySizeThenAddress {
  bool operator()(const Block* a, const Block* b) const {
    if (a->size != b->size) return a->size < b->size;
    return a->address < b->address;
  }
};

using Pool = std::set<Block*, BySizeThenAddress>;

/// Segments are laid out at increasing made-up addresses, apart from each
/// other so that no two segments' blocks ever look adjacent.
constexpr int64_t kSegmentGap = int64_t{1} << 30;

}  // namespace

struct CachingAllocatorModel::State {
  Pool small_pool;
  Pool large_pool;
  std::unordered_map<int64_t, Block*> live;
  std::unordered_set<int64_t> live_empty;  // 0-byte storages: no block
  std::unordered_set<Block*> all;
  int64_t next_address = kSegmentGap;
  int64_t segments = 0;

  Pool& pool_of(bool small) { return small ? small_pool : large_pool; }

  ~State() {
    for (Block* b : all) delete b;
  }
};

CachingAllocatorModel::CachingAllocatorModel(int64_t capacity)
    : state_(std::make_unique<State>()), capacity_(capacity) {
  if (capacity < 0) {
    throw Error(fmt::format("allocator capacity: must not be negative, got {}", capacity));
  }
}

CachingAllocatorModel::~CachingAllocatorModel() = default;

int64_t CachingAllocatorModel::round_size(int64_t bytes) {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  return kMinBlockSize * ((bytes + kMinBlockSize - 1) / kMinBlockSize);
}

int64_t CachingAllocatorModel::segment_size(int64_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
}

int64_t CachingAllocatorModel::segments() const { return state_->segments; }

void CachingAllocatorModel::empty_cache() {
  for (Pool* pool : {&state_->large_pool, &state_->small_pool}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      if (b->prev == nullptr && b->next == nullptr) {
        reserved_ -= b->size;
        --state_->segments;
        it = pool->erase(it);
        state_->all.erase(b);
        delete b;
      } else {
        ++it;
      }
    }
  }
}

bool CachingAllocatorModel::allocate(int64_t id, int64_t bytes) {
  State& s = *state_;
  if (bytes < 0) throw Error(fmt::format("allocation {}: negative size {}", id, bytes));
  if (s.live.count(id) != 0 || s.live_empty.count(id) != 0) {
    throw Error(fmt::format("allocation {}: that id is already live; each storage needs its own id", id));
  }
  if (bytes == 0) {  // the allocator hands out no memory for 0 bytes
    s.live_empty.insert(id);
    return true;
  }
  const int64_t size = round_size(bytes);
  const bool small = size <= kSmallSize;
  Pool& pool = s.pool_of(small);

  Block key;
  key.size = size;
  key.address = std::numeric_limits<int64_t>::min();
  Block* block = nullptr;
  auto it = pool.lower_bound(&key);
  if (it != pool.end()) {
    block = *it;
    pool.erase(it);
  } else {
    const int64_t segment = segment_size(size);
    if (reserved_ + segment > capacity_) {
      // cudaMalloc refused: give back every wholly free segment, try again.
      empty_cache();
      if (reserved_ + segment > capacity_) return false;
    }
    block = new Block;
    block->address = s.next_address;
    block->size = segment;
    block->small = small;
    s.next_address += segment + kSegmentGap;
    s.all.insert(block);
    ++s.segments;
    reserved_ += segment;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
  }

  const int64_t remaining = block->size - size;
  const bool split = small ? remaining >= kMinBlockSize : remaining > kSmallSize;
  if (split) {
    auto* front = new Block;
    front->address = block->address;
    front->size = size;
    front->small = small;
    front->prev = block->prev;
    if (front->prev) front->prev->next = front;
    front->next = block;
    block->prev = front;
    block->address += size;
    block->size -= size;
    pool.insert(block);
    s.all.insert(front);
    block = front;
  }
  block->allocated = true;
  block->requested = bytes;
  s.live[id] = block;
  allocated_ += block->size;
  requested_ += bytes;
  peak_allocated_ = std::max(peak_allocated_, allocated_);
  peak_requested_ = std::max(peak_requested_, requested_);
  return true;
}

void CachingAllocatorModel::free(int64_t id) {
  State& s = *state_;
  if (s.live_empty.erase(id) != 0) return;
  auto found = s.live.find(id);
  if (found == s.live.end()) {
    throw Error(fmt::format("free of {}: no live allocation has that id", id));
  }
  Block* block = found->second;
  s.live.erase(found);
  block->allocated = false;
  allocated_ -= block->size;
  requested_ -= block->requested;
  block->requested = 0;
  Pool& pool = s.pool_of(block->small);
  for (Block* neighbour : {block->prev, block->next}) {
    if (neighbour == nullptr || neighbour->allocated) continue;
    pool.erase(neighbour);
    if (neighbour == block->prev) {  // [neighbour block]
      block->address = neighbour->address;
      block->prev = neighbour->prev;
      if (block->prev) block->prev->next = block;
    } else {  // [block neighbour]
      block->next = neighbour->next;
      if (block->next) block->next->prev = block;
    }
    block->size += neighbour->size;
    s.all.erase(neighbour);
    delete neighbour;
  }
  pool.insert(block);
}

AllocatorReplay replay_trace(const AllocationTrace& trace, int64_t capacity) {
  CachingAllocatorModel model(capacity);
  AllocatorReplay out;
  for (size_t i = 0; i < trace.size(); ++i) {
    const AllocationEvent& e = trace[i];
    if (e.kind == AllocationEvent::Kind::kFree) {
      model.free(e.id);
      continue;
    }
    if (!model.allocate(e.id, e.bytes)) {
      out.fits = false;
      out.failed_event = static_cast<int64_t>(i);
      out.failed_bytes = e.bytes;
      out.allocated_at_failure = model.allocated_bytes();
      out.reserved_at_failure = model.reserved_bytes();
      break;
    }
  }
  out.peak_allocated = model.peak_allocated();
  out.peak_reserved = model.peak_reserved();
  out.peak_requested = model.peak_requested();
  return out;
}

}  // namespace batchtune
