#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace batchtune {

/// One event of a training step's memory trace: a storage allocated (`bytes`
/// as the tensor asked for them, before any rounding) or freed, by `id`.
struct AllocationEvent {
  enum class Kind { kAllocate, kFree };
  Kind kind = Kind::kAllocate;
  /// Which storage: an allocation's id comes back in its free.
  int64_t id = 0;
  /// The bytes asked for (allocations only).
  int64_t bytes = 0;

  static AllocationEvent allocate(int64_t id, int64_t bytes) { return {Kind::kAllocate, id, bytes}; }
  static AllocationEvent free(int64_t id) { return {Kind::kFree, id, 0}; }
};

/// A step's memory, event by event, in the order the step made them.
using AllocationTrace = std::vector<AllocationEvent>;

/// What a trace does to the caching allocator under a capacity.
struct AllocatorReplay {
  /// Every allocation was served.
  bool fits = true;
  /// The largest sum of live blocks, as `torch.cuda.max_memory_allocated`
  /// counts it: rounded sizes, and a block left unsplit counted whole.
  int64_t peak_allocated = 0;
  /// The largest sum of segments, as `torch.cuda.max_memory_reserved`.
  int64_t peak_reserved = 0;
  /// The largest sum of the bytes asked for (what a tensor-level tracker
  /// such as `MemTracker` sees).
  int64_t peak_requested = 0;
  /// The index in the trace of the allocation that found no memory (-1 when
  /// it fits), and the bytes it asked for.
  int64_t failed_event = -1;
  int64_t failed_bytes = 0;
  /// What was allocated and reserved when it failed.
  int64_t allocated_at_failure = 0;
  int64_t reserved_at_failure = 0;
};

/// A model of PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`,
/// the native backend as torch 2.11 ships it, with the default
/// `PYTORCH_CUDA_ALLOC_CONF`: no `max_split_size_mb`, no expandable segments,
/// no garbage-collection threshold, one stream), run on sizes only, with no
/// device: it answers what `memory_allocated`/`memory_reserved` would read and
/// whether a `cudaMalloc` would be refused, given how much memory the
/// allocator may take (`capacity`: the card's memory less what the CUDA
/// context and libraries hold outside the allocator).
///
/// What it follows:
/// - sizes round up to 512 bytes (`kMinBlockSize`); 0 bytes take no block;
/// - requests of at most 1 MiB (`kSmallSize`) come from the small pool, whose
///   segments are 2 MiB (`kSmallBuffer`); larger ones from the large pool,
///   whose segments are 20 MiB (`kLargeBuffer`) for requests under 10 MiB
///   (`kMinLargeAlloc`) and the request rounded up to 2 MiB (`kRoundLarge`)
///   otherwise;
/// - a request takes the smallest free block of its pool that holds it, the
///   lowest address among equals (best fit by size, then address);
/// - a small block splits when at least 512 bytes are left over, a large one
///   when more than 1 MiB is (else the whole block is handed out and counted
///   allocated);
/// - a freed block merges with free neighbours of its segment;
/// - when a new segment would take the reserved bytes past `capacity`, every
///   wholly free segment of both pools is released and the segment tried
///   again (`release_cached_blocks`); if it still does not fit, out of memory.
///
/// What it does not: several streams, CUDA graphs' private pools, the
/// `roundup_power2_divisions` and `max_split_size_mb` options, expandable
/// segments, the driver's own rounding of `cudaMalloc`.
///
/// Example:
/// ```
///   batchtune::CachingAllocatorModel model(1 << 30);
///   model.allocate(1, 3000);     // a 2 MiB small segment, a 3072-byte block
///   model.free(1);
///   model.reserved_bytes();      // 2097152: the segment stays cached
/// ```
class CachingAllocatorModel {
 public:
  /// All sizes are rounded to at least this many bytes.
  static constexpr int64_t kMinBlockSize = 512;
  /// The largest request served from the small pool: 1 MiB.
  static constexpr int64_t kSmallSize = 1 << 20;
  /// The small pool's segment: 2 MiB.
  static constexpr int64_t kSmallBuffer = 2 << 20;
  /// The large pool's segment for requests between 1 and 10 MiB: 20 MiB.
  static constexpr int64_t kLargeBuffer = 20 << 20;
  /// Requests from here up get a segment of their own: 10 MiB.
  static constexpr int64_t kMinLargeAlloc = 10 << 20;
  /// Such a segment's size is rounded up to 2 MiB.
  static constexpr int64_t kRoundLarge = 2 << 20;

  /// An allocator that may reserve at most `capacity` bytes.
  explicit CachingAllocatorModel(int64_t capacity);
  ~CachingAllocatorModel();
  CachingAllocatorModel(const CachingAllocatorModel&) = delete;
  CachingAllocatorModel& operator=(const CachingAllocatorModel&) = delete;

  /// Serves `bytes` for storage `id`; false when the allocator would raise
  /// out of memory (nothing changes then, except cached segments released).
  /// Throws `batchtune::Error` for an id that is already live or a negative size.
  bool allocate(int64_t id, int64_t bytes);
  /// Gives storage `id`'s block back to its pool. Throws `batchtune::Error`
  /// for an id that is not live.
  void free(int64_t id);
  /// Releases every wholly free segment, as `torch.cuda.empty_cache()`.
  void empty_cache();

  int64_t allocated_bytes() const { return allocated_; }
  int64_t reserved_bytes() const { return reserved_; }
  int64_t requested_bytes() const { return requested_; }
  int64_t peak_allocated() const { return peak_allocated_; }
  int64_t peak_reserved() const { return peak_reserved_; }
  int64_t peak_requested() const { return peak_requested_; }
  /// How many segments are held now.
  int64_t segments() const;

  /// The block size a request of `bytes` takes: at least 512, a multiple of 512.
  static int64_t round_size(int64_t bytes);
  /// The segment a new block of `rounded` bytes is carved from.
  static int64_t segment_size(int64_t rounded);

 private:
  struct State;
  std::unique_ptr<State> state_;
  int64_t capacity_;
  int64_t allocated_ = 0;
  int64_t reserved_ = 0;
  int64_t requested_ = 0;
  int64_t peak_allocated_ = 0;
  int64_t peak_reserved_ = 0;
  int64_t peak_requested_ = 0;
};

/// Replays `trace` through a fresh `CachingAllocatorModel` of `capacity`
/// bytes, stopping at the first allocation that finds no memory. Frees of
/// ids the trace never allocated are errors (`batchtune::Error`).
///
/// Example:
/// ```
///   batchtune::AllocationTrace trace = {batchtune::AllocationEvent::allocate(1, 12 << 20)};
///   auto replay = batchtune::replay_trace(trace, 80LL << 30);
///   replay.peak_reserved;  // 12 MiB: a segment of its own, rounded to 2 MiB
/// ```
AllocatorReplay replay_trace(const AllocationTrace& trace, int64_t capacity);

}  // namespace batchtune
