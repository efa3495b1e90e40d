#include <gtest/gtest.h>

#include <map>

#include "batchtune/common/error.h"
#include "batchtune/preflight/batch_estimate.h"
#include "batchtune/preflight/caching_allocator_model.h"
#include "batchtune/preflight/gpu_profile.h"

using batchtune::AllocationEvent;
using batchtune::AllocationTrace;
using batchtune::CachingAllocatorModel;
using batchtune::replay_trace;

namespace {
constexpr int64_t KiB = 1024;
constexpr int64_t MiB = 1024 * 1024;
constexpr int64_t GiB = 1024 * MiB;
constexpr int64_t kRoomy = 80 * GiB;
}  // namespace

TEST(CachingAllocatorModel, RoundsTo512BytesAndPicksTheSegment) {
  EXPECT_EQ(CachingAllocatorModel::round_size(1), 512);
  EXPECT_EQ(CachingAllocatorModel::round_size(512), 512);
  EXPECT_EQ(CachingAllocatorModel::round_size(513), 1024);
  EXPECT_EQ(CachingAllocatorModel::round_size(1 * MiB + 1), 1 * MiB + 512);
  // <= 1 MiB: a 2 MiB small segment; up to 10 MiB: a 20 MiB one; from 10
  // MiB: its own, rounded up to 2 MiB.
  EXPECT_EQ(CachingAllocatorModel::segment_size(1 * MiB), 2 * MiB);
  EXPECT_EQ(CachingAllocatorModel::segment_size(1 * MiB + 512), 20 * MiB);
  EXPECT_EQ(CachingAllocatorModel::segment_size(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(CachingAllocatorModel::segment_size(10 * MiB), 10 * MiB);
  EXPECT_EQ(CachingAllocatorModel::segment_size(11 * MiB + 1), 12 * MiB);
}

TEST(CachingAllocatorModel, ASmallAllocationTakesA2MiBSegmentAndCountsItsRoundedSize) {
  CachingAllocatorModel m(kRoomy);
  ASSERT_TRUE(m.allocate(1, 1000));  // 1000 -> 1024 bytes, in a new 2 MiB segment
  EXPECT_EQ(m.allocated_bytes(), 1024);
  EXPECT_EQ(m.requested_bytes(), 1000);
  EXPECT_EQ(m.reserved_bytes(), 2 * MiB);
  ASSERT_TRUE(m.allocate(2, 100));  // 512 bytes, carved from the same segment's rest
  EXPECT_EQ(m.allocated_bytes(), 1024 + 512);
  EXPECT_EQ(m.reserved_bytes(), 2 * MiB);
  EXPECT_EQ(m.segments(), 1);
  ASSERT_TRUE(m.allocate(3, 0));  // 0 bytes: no block at all
  EXPECT_EQ(m.allocated_bytes(), 1024 + 512);
  m.free(3);
}

TEST(CachingAllocatorModel, AFreedSmallBlockIsReusedNotReallocated) {
  CachingAllocatorModel m(kRoomy);
  // Fill one small segment exactly: two 1 MiB blocks (1 MiB each, no rest).
  ASSERT_TRUE(m.allocate(1, 1 * MiB));
  ASSERT_TRUE(m.allocate(2, 1 * MiB));
  EXPECT_EQ(m.segments(), 1);
  EXPECT_EQ(m.reserved_bytes(), 2 * MiB);
  m.free(1);
  // 600 KiB fits the freed 1 MiB block (best fit): still one segment, and the
  // block splits (424 KiB left >= 512 bytes), so 600 KiB are allocated.
  ASSERT_TRUE(m.allocate(3, 600 * KiB));
  EXPECT_EQ(m.segments(), 1);
  EXPECT_EQ(m.reserved_bytes(), 2 * MiB);
  EXPECT_EQ(m.allocated_bytes(), 1 * MiB + 600 * KiB);
}

TEST(CachingAllocatorModel, ALargeBlockSplitsOnlyWhenMoreThan1MiBIsLeft) {
  CachingAllocatorModel m(kRoomy);
  // 4 MiB: a 20 MiB segment, split (16 MiB left > 1 MiB).
  ASSERT_TRUE(m.allocate(1, 4 * MiB));
  EXPECT_EQ(m.reserved_bytes(), 20 * MiB);
  EXPECT_EQ(m.allocated_bytes(), 4 * MiB);
  // 15.5 MiB would not get the 16 MiB rest from a fresh request (>= 10 MiB
  // takes a segment of its own), but 9 MiB does: 7 MiB left, split again.
  ASSERT_TRUE(m.allocate(2, 9 * MiB));
  EXPECT_EQ(m.reserved_bytes(), 20 * MiB);
  EXPECT_EQ(m.allocated_bytes(), 13 * MiB);
  // 6.5 MiB from the 7 MiB rest: 0.5 MiB left, not > 1 MiB, so the whole
  // 7 MiB block is handed out and counted allocated.
  ASSERT_TRUE(m.allocate(3, 6 * MiB + 512 * KiB));
  EXPECT_EQ(m.reserved_bytes(), 20 * MiB);
  EXPECT_EQ(m.allocated_bytes(), 20 * MiB);
  EXPECT_EQ(m.requested_bytes(), 4 * MiB + 9 * MiB + 6 * MiB + 512 * KiB);
}

TEST(CachingAllocatorModel, FreedNeighboursCoalesceWithinTheirSegment) {
  CachingAllocatorModel m(kRoomy);
  // A 20 MiB segment cut into 3 + 3 + 3 MiB and an 11 MiB rest.
  ASSERT_TRUE(m.allocate(1, 3 * MiB));
  ASSERT_TRUE(m.allocate(2, 3 * MiB));
  ASSERT_TRUE(m.allocate(3, 3 * MiB));
  EXPECT_EQ(m.reserved_bytes(), 20 * MiB);
  // Freeing 1 and 2 merges them into one free 6 MiB block; 3 stays live.
  m.free(1);
  m.free(2);
  // 5 MiB: best fit is the merged 6 MiB block (the 11 MiB rest is larger);
  // 1 MiB left, not > 1 MiB: the whole 6 MiB is handed out. No new segment.
  ASSERT_TRUE(m.allocate(4, 5 * MiB));
  EXPECT_EQ(m.segments(), 1);
  EXPECT_EQ(m.allocated_bytes(), 6 * MiB + 3 * MiB);
  // Without the merge neither 3 MiB block could hold 5 MiB and it would have
  // split the 11 MiB rest: allocated would read 5 + 3 MiB.
  m.free(3);
  m.free(4);
  // All free again: the segment is one block, released whole by empty_cache.
  m.empty_cache();
  EXPECT_EQ(m.reserved_bytes(), 0);
  EXPECT_EQ(m.segments(), 0);
}

TEST(CachingAllocatorModel, From10MiBAnAllocationGetsItsOwn2MiBRoundedSegment) {
  AllocationTrace t = {AllocationEvent::allocate(1, 10 * MiB + 1),  // 12 MiB segment
                       AllocationEvent::allocate(2, 33 * MiB),      // 34 MiB segment
                       AllocationEvent::free(1), AllocationEvent::free(2)};
  auto r = replay_trace(t, kRoomy);
  EXPECT_TRUE(r.fits);
  EXPECT_EQ(r.peak_reserved, 12 * MiB + 34 * MiB);
  // 10 MiB + 1 byte rounds to 10 MiB + 512; the 12 MiB segment's rest is
  // 2 MiB - 512 > 1 MiB, so it splits; 33 MiB leaves 1 MiB, not > 1 MiB, so
  // the whole 34 MiB block counts allocated.
  EXPECT_EQ(r.peak_allocated, 10 * MiB + 512 + 34 * MiB);
  EXPECT_EQ(r.peak_requested, 10 * MiB + 1 + 33 * MiB);
}

TEST(CachingAllocatorModel, FragmentationFailsATraceWhoseAllocatedPeakWouldFit) {
  // Capacity 40 MiB. Two 20 MiB segments, each holding a 9 MiB block kept
  // live and a freed 9 MiB one plus a 2 MiB rest; then 12 MiB asks for its own
  // 12 MiB segment. Allocated never passes 9 + 9 + 12 = 30 MiB, yet 40 MiB
  // are reserved and no segment is wholly free to give back: out of memory.
  AllocationTrace t = {
      AllocationEvent::allocate(1, 9 * MiB), AllocationEvent::allocate(2, 9 * MiB),   // segment A
      AllocationEvent::allocate(3, 9 * MiB), AllocationEvent::allocate(4, 9 * MiB),   // segment B
      AllocationEvent::free(2), AllocationEvent::free(4),
      AllocationEvent::allocate(5, 12 * MiB),
  };
  auto r = replay_trace(t, 40 * MiB);
  EXPECT_FALSE(r.fits);
  EXPECT_EQ(r.failed_event, 6);
  EXPECT_EQ(r.failed_bytes, 12 * MiB);
  EXPECT_EQ(r.reserved_at_failure, 40 * MiB);
  EXPECT_EQ(r.allocated_at_failure, 18 * MiB);
  // The same trace with an allocator that merely counted tensors would fit:
  EXPECT_LE(r.allocated_at_failure + 12 * MiB, 40 * MiB);
  // And with room for a third segment it does.
  EXPECT_TRUE(replay_trace(t, 52 * MiB).fits);
}

TEST(CachingAllocatorModel, AtTheCapWhollyFreeSegmentsAreReleasedAndTheAllocationRetried) {
  // Capacity 30 MiB. A 20 MiB segment used and freed whole stays cached;
  // 24 MiB does not fit its free 20 MiB block and needs a segment of its
  // own: 20 + 24 > 30, so the cached segment goes back and the 24 MiB one is
  // made.
  CachingAllocatorModel m(30 * MiB);
  ASSERT_TRUE(m.allocate(1, 5 * MiB));
  m.free(1);
  EXPECT_EQ(m.reserved_bytes(), 20 * MiB);
  ASSERT_TRUE(m.allocate(2, 24 * MiB));
  EXPECT_EQ(m.reserved_bytes(), 24 * MiB);
  EXPECT_EQ(m.peak_reserved(), 24 * MiB);
  // A small segment (2 MiB) still fits beside it; 17 MiB more (an 18 MiB
  // segment) does not, and no segment is wholly free to give back.
  ASSERT_TRUE(m.allocate(3, 100));
  EXPECT_EQ(m.reserved_bytes(), 26 * MiB);
  EXPECT_FALSE(m.allocate(4, 17 * MiB));
  EXPECT_EQ(m.reserved_bytes(), 26 * MiB);
  // A freed block is reused before any segment is made: 12 MiB after
  // freeing the 24 MiB block splits it (12 MiB left > 1 MiB), nothing new.
  m.free(2);
  ASSERT_TRUE(m.allocate(5, 12 * MiB));
  EXPECT_EQ(m.reserved_bytes(), 26 * MiB);
  EXPECT_EQ(m.allocated_bytes(), 12 * MiB + 512);
}

TEST(CachingAllocatorModel, BadTracesAreErrorsNamingTheId) {
  CachingAllocatorModel m(kRoomy);
  ASSERT_TRUE(m.allocate(7, 100));
  EXPECT_THROW(m.allocate(7, 100), batchtune::Error);
  EXPECT_THROW(m.free(8), batchtune::Error);
  try {
    replay_trace({AllocationEvent::free(42)}, kRoomy);
    ADD_FAILURE() << "a free of an unknown id was accepted";
  } catch (const batchtune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("42"), std::string::npos) << e.what();
  }
}

TEST(GpuProfile, KnowsTheCardsByShortNameAndOrdersTheirMemory) {
  auto h200 = batchtune::gpu_profile("H200");
  auto h100 = batchtune::gpu_profile("h100");
  auto l4 = batchtune::gpu_profile("L4");
  EXPECT_EQ(h100.name, "H100");
  EXPECT_GT(h200.allocator_capacity(), h100.allocator_capacity());
  EXPECT_GT(h100.allocator_capacity(), l4.allocator_capacity());
  EXPECT_EQ(h100.context_high, 749 * MiB);
  EXPECT_LT(h100.allocator_capacity(true), h100.allocator_capacity(false));
  EXPECT_EQ(h100.cublas_workspace, 32 * MiB);
  EXPECT_FALSE(h100.source.empty());
  auto cpu = batchtune::gpu_profile("cpu", 512 * MiB);
  EXPECT_TRUE(cpu.emulated);
  EXPECT_EQ(cpu.allocator_capacity(), 512 * MiB);
}

TEST(GpuProfile, AnUnknownNameIsAnErrorListingTheKnownOnes) {
  try {
    batchtune::gpu_profile("H1000");
    ADD_FAILURE() << "H1000 was accepted";
  } catch (const batchtune::Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("H1000"), std::string::npos) << what;
    EXPECT_NE(what.find("A100-80GB"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  EXPECT_THROW(batchtune::gpu_profile("cpu"), batchtune::Error);
}

namespace {

/// A made-up step whose one tensor takes `n` MiB (and a 1 KiB scalar).
AllocationTrace linear_step(int64_t n) {
  return {AllocationEvent::allocate(0, n * MiB), AllocationEvent::allocate(1, 1000),
          AllocationEvent::free(1), AllocationEvent::free(0)};
}

}  // namespace

TEST(BatchEstimate, FindsTheLargestBatchAtBothEndsTracingEachBatchOnce) {
  // The emulated device: 200 MiB less a 10 % margin is 180 MiB usable (the
  // high end: 179 MiB + 1000 bytes fits, 180 MiB + 1000 does not); the low
  // end keeps 5 % of that back, 171 MiB: 170.
  auto cpu = batchtune::gpu_profile("cpu", 200 * MiB);
  std::map<int64_t, int> calls;
  auto e = batchtune::estimate_largest_batch(
      [&](int64_t n) {
        ++calls[n];
        return linear_step(n);
      },
      cpu, 0.10);
  EXPECT_EQ(e.capacity.high, 180 * MiB);
  EXPECT_EQ(e.capacity.low, static_cast<int64_t>(180 * MiB * 0.95));
  EXPECT_EQ(e.high, 179);
  EXPECT_EQ(e.low, 170);
  for (const auto& [n, count] : calls) EXPECT_EQ(count, 1) << "batch " << n << " traced again";
  EXPECT_FALSE(e.trials.empty());
}

TEST(BatchEstimate, AGpusAnswerAddsTheWorkspaceAndGrowsWithTheCard) {
  auto h100 = batchtune::gpu_profile("H100");
  auto l4 = batchtune::gpu_profile("L4");
  auto on_h100 = batchtune::estimate_largest_batch(linear_step, h100, 0.10);
  auto on_l4 = batchtune::estimate_largest_batch(linear_step, l4, 0.10);
  EXPECT_LT(on_l4.low, on_h100.low);
  EXPECT_LE(on_h100.low, on_h100.high);
  // One tensor of n MiB (n >= 10) takes its own segment of n MiB rounded to
  // 2 MiB, beside cuBLAS's 32 MiB and a 2 MiB small segment: the high end is
  // the largest n with 32 + 2 + round2(n) MiB within the capacity.
  const int64_t room = on_h100.capacity.high / MiB - 32 - 2;
  EXPECT_EQ(on_h100.high, room % 2 == 0 ? room : room - 1);
  // The replay of the answer fits, of one more sample does not.
  EXPECT_TRUE(batchtune::replay_on(linear_step(on_h100.low), h100, on_h100.capacity.low).fits);
  EXPECT_FALSE(batchtune::replay_on(linear_step(on_h100.low + 2), h100, on_h100.capacity.low).fits);
}

TEST(BatchEstimate, BadArgumentsAreErrors) {
  auto cpu = batchtune::gpu_profile("cpu", 200 * MiB);
  EXPECT_THROW(batchtune::estimate_largest_batch(linear_step, cpu, 0.10, 0), batchtune::Error);
  EXPECT_THROW(batchtune::estimate_largest_batch(linear_step, cpu, 1.5), batchtune::Error);
  // Nothing fits: 0.
  EXPECT_EQ(batchtune::estimate_largest_batch(linear_step, batchtune::gpu_profile("cpu", MiB), 0.10).high, 0);
}
