#include "batchtune/memory/budget_allocator.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <vector>

namespace {

using batchtune::BudgetAllocator;

constexpr int64_t kMiB = int64_t{1} << 20;

/// Restores an unlimited budget after each test.
class BudgetAllocatorTest : public testing::Test {
 protected:
  void SetUp() override {
    budget_.set_budget(BudgetAllocator::kUnlimited);
    budget_.reset_peak();
  }
  void TearDown() override { budget_.set_budget(BudgetAllocator::kUnlimited); }

  BudgetAllocator& budget_ = BudgetAllocator::install();
};

TEST_F(BudgetAllocatorTest, IsLibTorchsCpuAllocator) {
  EXPECT_EQ(c10::GetAllocator(c10::DeviceType::CPU), &budget_);
  EXPECT_EQ(BudgetAllocator::installed(), &budget_);
}

TEST_F(BudgetAllocatorTest, CountsLiveAndPeakBytes) {
  const int64_t before = budget_.live_bytes();
  {
    auto a = torch::empty({kMiB / 4}, torch::kFloat);  // 1 MiB
    EXPECT_EQ(budget_.live_bytes(), before + kMiB);
    {
      auto b = torch::empty({kMiB / 2}, torch::kFloat);  // 2 MiB
      EXPECT_EQ(budget_.live_bytes(), before + 3 * kMiB);
    }
    EXPECT_EQ(budget_.live_bytes(), before + kMiB);
  }
  EXPECT_EQ(budget_.live_bytes(), before);
  EXPECT_EQ(budget_.peak_bytes(), before + 3 * kMiB);
  budget_.reset_peak();
  EXPECT_EQ(budget_.peak_bytes(), before);
}

TEST_F(BudgetAllocatorTest, ThrowsCudaStyleOutOfMemoryPastTheBudget) {
  const int64_t before = budget_.live_bytes();
  budget_.set_budget(before + 4 * kMiB);
  auto fits = torch::empty({kMiB / 4 * 3}, torch::kFloat);  // 3 MiB
  const int64_t refused = budget_.oom_count();
  EXPECT_THROW(torch::empty({kMiB / 2}, torch::kFloat), c10::OutOfMemoryError);
  EXPECT_EQ(budget_.oom_count(), refused + 1);
  EXPECT_EQ(budget_.live_bytes(), before + 3 * kMiB);
}

TEST_F(BudgetAllocatorTest, RecoversAfterOutOfMemoryInsideAStep) {
  torch::manual_seed(0);
  torch::nn::Linear layer(256, 256);
  const int64_t before = budget_.live_bytes();
  budget_.set_budget(before + 6 * kMiB);
  bool thrown = false;
  try {
    auto x = torch::randn({4096, 256});  // 4 MiB fits; its 4 MiB output does not
    layer(x).sum().backward();
  } catch (const c10::OutOfMemoryError& e) {
    thrown = true;
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos);
  }
  EXPECT_TRUE(thrown);
  layer->zero_grad(true);
  EXPECT_EQ(budget_.live_bytes(), before);
  // A smaller batch runs within the same budget.
  auto x = torch::randn({64, 256});
  layer(x).sum().backward();
  EXPECT_TRUE(layer->weight.grad().defined());
}

TEST_F(BudgetAllocatorTest, UncountedScopeKeepsHostCopiesOutOfTheBudget) {
  const int64_t before = budget_.live_bytes();
  budget_.set_budget(before + kMiB);
  torch::Tensor copy;
  {
    BudgetAllocator::UncountedScope uncounted;
    copy = torch::zeros({kMiB}, torch::kFloat);  // 4 MiB, above the budget
  }
  EXPECT_EQ(budget_.live_bytes(), before);
  copy.reset();
  EXPECT_EQ(budget_.live_bytes(), before);
}

TEST_F(BudgetAllocatorTest, CountOnlyKeepsTheDevicesBlocksAndMakesTheRestHostMemory) {
  auto weights = torch::empty({kMiB / 4}, torch::kFloat);  // 1 MiB, the device's
  auto data = torch::empty({kMiB / 2}, torch::kFloat);     // 2 MiB, the host's
  const int64_t before = budget_.live_bytes();
  const int64_t host = budget_.count_only({weights.data_ptr()});
  EXPECT_GE(host, 2 * kMiB) << "the data and whatever else was live";
  EXPECT_EQ(budget_.live_bytes(), before - host);
  EXPECT_EQ(budget_.peak_bytes(), budget_.live_bytes());
  // The host's block freed counts nothing; the device's still counts.
  const int64_t after = budget_.live_bytes();
  data.reset();
  EXPECT_EQ(budget_.live_bytes(), after);
  weights.reset();
  EXPECT_EQ(budget_.live_bytes(), after - kMiB);
  budget_.count_only({});  // nothing counted is left behind for other tests
  EXPECT_EQ(budget_.live_bytes(), 0);
}

TEST_F(BudgetAllocatorTest, CachesFreedBlocksAndReleasesThem) {
  budget_.release_cached();
  void* first = nullptr;
  {
    auto a = torch::empty({kMiB}, torch::kFloat);
    first = a.data_ptr();
  }
  EXPECT_GE(budget_.cached_bytes(), 4 * kMiB);
  {
    auto b = torch::empty({kMiB}, torch::kFloat);
    EXPECT_EQ(b.data_ptr(), first);  // the same block, no page faults
  }
  budget_.release_cached();
  EXPECT_EQ(budget_.cached_bytes(), 0);
  budget_.set_caching(false);
  { auto c = torch::empty({kMiB}, torch::kFloat); }
  EXPECT_EQ(budget_.cached_bytes(), 0);
  budget_.set_caching(true);
}

TEST_F(BudgetAllocatorTest, ReturnsAlignedPointersEqualToTheirContext) {
  for (size_t bytes : {1, 63, 4096, 1 << 20, (1 << 20) + 7}) {
    void* raw = budget_.raw_allocate(bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(raw) % 64, 0u);
    budget_.raw_deallocate(raw);
  }
}

}  // namespace

namespace {

// release() runs in tensors' destructors and must not allocate (a bad_alloc
// there ends the process): freed blocks are kept in lists threaded through
// the blocks themselves. Several blocks of one size go in and come out
// again, in last-in first-out order, after release_cached() too.
TEST_F(BudgetAllocatorTest, FreedBlocksAreCachedInListsThroughTheBlocks) {
  budget_.set_caching(true);
  budget_.release_cached();
  constexpr size_t kBytes = 25 * 512;  // one size class, its capacity exactly
  std::vector<c10::DataPtr> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(budget_.allocate(kBytes));
  std::vector<void*> addresses;
  for (const auto& b : blocks) addresses.push_back(b.get());
  const int64_t cached_before = budget_.cached_bytes();
  blocks.clear();  // freed: last-freed on top of the list
  EXPECT_GT(budget_.cached_bytes(), cached_before);
  std::vector<c10::DataPtr> again;
  for (int i = 0; i < 4; ++i) again.push_back(budget_.allocate(kBytes));
  std::vector<void*> reused;
  for (const auto& b : again) reused.push_back(b.get());
  std::sort(addresses.begin(), addresses.end());
  std::sort(reused.begin(), reused.end());
  EXPECT_EQ(reused, addresses) << "the cache handed back the freed blocks";
  EXPECT_EQ(budget_.cached_bytes(), cached_before);
  again.clear();
  budget_.release_cached();
  EXPECT_EQ(budget_.cached_bytes(), 0);
  // The emptied lists still take blocks.
  { auto block = budget_.allocate(kBytes); }
  EXPECT_GT(budget_.cached_bytes(), 0);
  budget_.release_cached();
}

}  // namespace

namespace {

TEST_F(BudgetAllocatorTest, KeepsEveryBlockOfAStepWhoseBlocksOverTimeExceedItsPeak) {
  // A step as training runs it: its batch is freed before the activations
  // peak, so its blocks over time are more than its peak at any moment.
  // All of them must stay cached, or the largest is mapped again (and
  // faulted in page by page) every step.
  budget_.release_cached();
  budget_.reset_peak();
  const auto step = [] {
    auto batch = torch::empty({3 * kMiB / 4}, torch::kFloat);  // 3 MiB
    batch.reset();
    std::vector<torch::Tensor> activations;
    for (int i = 0; i < 3; ++i) activations.push_back(torch::empty({15 * kMiB}, torch::kFloat));
  };
  step();
  const int64_t cached = budget_.cached_bytes();
  EXPECT_GE(cached, 183 * kMiB) << "the batch and all three activation blocks";
  step();
  EXPECT_EQ(budget_.cached_bytes(), cached) << "the second step reused them all";
  EXPECT_LE(cached, static_cast<int64_t>(1.25 * static_cast<double>(budget_.peak_bytes())) +
                        kMiB);
  budget_.release_cached();
}

}  // namespace
