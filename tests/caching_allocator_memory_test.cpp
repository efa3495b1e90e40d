#include "memory/caching_allocator_memory.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "batchtune/common/error.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/models/module_model.h"
#include "batchtune/step/trial.h"
#include "batchtune/step/workload.h"
#include "memory/cuda_support.h"

namespace batchtune {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

/// What the fake device shows; the test changes it between calls.
struct FakeDeviceState {
  int64_t total = 80 * kGiB;
  int64_t used = 0;            ///< by anyone, as cudaMemGetInfo sees it
  AllocatorStats stats;
  double fraction = -1;        ///< last memory fraction set
  int fraction_sets = 0;
  int synchronized = 0;
  int peak_resets = 0;
  int64_t used_growth_per_sync = 0;  ///< memory outside the allocator appearing per step
};

class FakeCudaDevice final : public CudaDeviceApi {
 public:
  FakeCudaDevice(FakeDeviceState& state, int index) : state_(state), index_(index) {}
  int index() const override { return index_; }
  int64_t total_bytes() const override { return state_.total; }
  int64_t used_bytes() const override { return state_.used; }
  AllocatorStats stats() const override { return state_.stats; }
  void set_memory_fraction(double fraction) override {
    state_.fraction = fraction;
    ++state_.fraction_sets;
  }
  void reset_peak_stats() override {
    ++state_.peak_resets;
    state_.stats.reserved_peak = state_.stats.reserved_current;
    state_.stats.allocated_peak = state_.stats.allocated_current;
  }
  void empty_cache() override {
    state_.used -= state_.stats.reserved_current - state_.stats.allocated_current;
    state_.stats.reserved_current = state_.stats.allocated_current;
  }
  void synchronize() override {
    ++state_.synchronized;
    state_.used += state_.used_growth_per_sync;
  }

 private:
  FakeDeviceState& state_;
  int index_;
};

std::unique_ptr<DeviceMemory> fake_memory(FakeDeviceState& state, std::optional<int64_t> limit,
                                          int index = 0) {
  return make_caching_allocator_memory(std::make_unique<FakeCudaDevice>(state, index), limit);
}

/// The allocator's cap in bytes, as LibTorch computes it from the fraction.
int64_t cap_bytes(const FakeDeviceState& state) {
  return static_cast<int64_t>(state.fraction * static_cast<double>(state.total));
}

TEST(CachingAllocatorMemory, ALimitIsASmallerGpuCountingMemoryOutsideTheAllocator) {
  FakeDeviceState state;
  state.used = 600 * kMiB;  // the CUDA context, before any tensor
  auto memory = fake_memory(state, 16 * kGiB);
  EXPECT_EQ(memory->capacity_bytes(), 16 * kGiB);
  EXPECT_EQ(memory->usable_bytes(), 16 * kGiB);
  // The allocator may reserve the limit less the context and the headroom,
  // as a fraction of totalGlobalMem (what LibTorch multiplies it by).
  EXPECT_NEAR(cap_bytes(state), 16 * kGiB - 600 * kMiB - kCudaOutsideGrowthBytes, 1.0);

  memory->set_usable_bytes(static_cast<int64_t>(16 * kGiB * 0.9));  // a 10 % margin
  EXPECT_NEAR(cap_bytes(state),
              static_cast<int64_t>(16 * kGiB * 0.9) - 600 * kMiB - kCudaOutsideGrowthBytes, 1.0);
}

TEST(CachingAllocatorMemory, NoLimitAndNoMarginStillCapsTheAllocator) {
  FakeDeviceState state;
  state.used = 500 * kMiB;
  auto memory = fake_memory(state, std::nullopt);
  EXPECT_EQ(memory->capacity_bytes(), state.total);
  memory->set_usable_bytes(memory->capacity_bytes());  // --margin 0
  EXPECT_LT(state.fraction, 1.0);  // LibTorch sets no cap at all for 1
  EXPECT_NEAR(cap_bytes(state), state.total - 500 * kMiB - kCudaOutsideGrowthBytes, 1.0);
  EXPECT_LT(memory_fraction_for(state.total, state.total), 1.0);
  EXPECT_EQ(memory_fraction_for(-5, state.total), 0.0);
}

TEST(CachingAllocatorMemory, ALimitAboveTheGpuIsTheGpu) {
  FakeDeviceState state;
  auto memory = fake_memory(state, 1000 * kGiB);
  EXPECT_EQ(memory->capacity_bytes(), state.total);
}

TEST(CachingAllocatorMemory, ALimitThatLeavesNothingIsABadInput) {
  FakeDeviceState state;
  state.used = 700 * kMiB;
  try {
    fake_memory(state, 800 * kMiB);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--memory-limit"), std::string::npos) << e.what();
  }
}

TEST(CachingAllocatorMemory, PeakCountsTheAllocatorAndTheHighestOutsideMemory) {
  FakeDeviceState state;
  state.used = 500 * kMiB;
  auto memory = fake_memory(state, 8 * kGiB);
  memory->reset_peak();
  // A step: the allocator reserves 2 GiB, and 100 MiB appear outside it.
  state.stats.reserved_current = 2 * kGiB;
  state.stats.reserved_peak = 2 * kGiB;
  state.used += 2 * kGiB + 100 * kMiB;
  memory->synchronize();
  EXPECT_EQ(memory->peak_bytes(), 2 * kGiB + 600 * kMiB);
  // The cache is emptied; the outside memory stays and the next trial's cap
  // is lowered by it.
  memory->release_cached();  // the fake returns the 2 GiB to the device
  EXPECT_EQ(state.used, 600 * kMiB);
  const int64_t cap_before = cap_bytes(state);
  memory->reset_peak();
  EXPECT_EQ(memory->peak_bytes(), 600 * kMiB);
  EXPECT_NEAR(cap_before - cap_bytes(state), 100 * kMiB, 1.0);
}

TEST(CachingAllocatorMemory, TheOutsideBaselineIsFrozenAfterTheFirstTrialSoTheCapHolds) {
  FakeDeviceState state;
  state.used = 500 * kMiB;
  auto memory = fake_memory(state, 8 * kGiB);
  memory->reset_peak();
  state.used += 300 * kMiB;  // the first trial loads kernels and handles
  memory->synchronize();
  memory->reset_peak();      // the second trial: the baseline follows, once
  const int64_t cap = cap_bytes(state);
  for (int trial = 0; trial < 3; ++trial) {
    state.used += 20 * kMiB;  // later trials leave a little behind
    memory->synchronize();
    memory->reset_peak();
    EXPECT_EQ(cap_bytes(state), cap) << "trial " << trial << ": the cap no longer moves";
  }
  // What grew since still counts in a trial's peak.
  memory->synchronize();
  EXPECT_EQ(memory->peak_bytes(), 800 * kMiB + 60 * kMiB);
}

TEST(CachingAllocatorMemory, ReportsTheAllocatorsOutOfMemoryCounter) {
  FakeDeviceState state;
  auto memory = fake_memory(state, std::nullopt);
  EXPECT_EQ(memory->oom_count(), 0);
  state.stats.num_ooms = 3;
  EXPECT_EQ(memory->oom_count(), 3);
}

TEST(CachingAllocatorMemory, BelongsToAndSynchronizesItsOwnDevice) {
  FakeDeviceState state;
  auto memory = fake_memory(state, std::nullopt, 3);
  EXPECT_EQ(memory->device(), c10::Device(c10::kCUDA, 3));
  memory->synchronize();
  EXPECT_EQ(state.synchronized, 1);
  EXPECT_NE(memory->summary().find("cuda:3"), std::string::npos) << memory->summary();
}

TEST(CachingAllocatorMemory, OutsideMemoryGrowingDuringATrialMakesItOverBudget) {
  // The trial runner compares the peak with the usable budget; on CUDA that
  // can fail now when memory outside the allocator grows past the headroom.
  FakeDeviceState state;
  state.used = 500 * kMiB;
  auto memory = fake_memory(state, 4 * kGiB);
  Workload workload(WorkloadOptions().model("mlp").input_shape({1, 8, 8}).seed(1));
  TrialRunner runner(workload, *memory, 0.1);
  EXPECT_TRUE(runner.run(TrialOptions().batch_size(4)).fits);
  state.used_growth_per_sync = kGiB;  // far past the headroom, each step
  const TrialResult r = runner.run(TrialOptions().batch_size(4).steps(3));
  EXPECT_FALSE(r.fits);
  EXPECT_EQ(r.failure, TrialFailure::kOverBudget);
  EXPECT_GT(r.peak_bytes, r.usable_bytes);
}

// On a GPU: the memory object works before any CUDA tensor exists (a
// library user's order; ctest runs this in a process of its own), makes its
// device current and counts the CUDA context outside the allocator.
TEST(CudaMemory, WorksBeforeTheFirstCudaTensor_CUDA) {
  auto memory = make_device_memory(c10::Device(c10::kCUDA, 0), 2 * kGiB);
  EXPECT_EQ(memory->capacity_bytes(), 2 * kGiB);
  memory->reset_peak();
  const int64_t before = memory->peak_bytes();
  EXPECT_GT(before, 0);  // the context, outside the allocator
  {
    auto t = torch::empty({256 * kMiB / 4}, torch::TensorOptions().device(torch::kCUDA));
    memory->synchronize();
    EXPECT_GE(memory->live_bytes(), 256 * kMiB);
    EXPECT_GE(memory->peak_bytes(), before + 256 * kMiB);
  }
  // Past the cap: the caching allocator refuses and counts it.
  const int64_t ooms = memory->oom_count();
  EXPECT_THROW(torch::empty({3 * kGiB / 4}, torch::TensorOptions().device(torch::kCUDA)),
               c10::OutOfMemoryError);
  EXPECT_EQ(memory->oom_count(), ooms + 1);
  memory->release_cached();
}

TEST(CudaMemory, TrialLeavesTheCudaRandomStreamAsItWas_CUDA) {
  auto memory = make_device_memory(c10::Device(c10::kCUDA, 0), std::nullopt);
  // Dropout on the GPU draws from the CUDA generator at every step.
  auto net = torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Dropout(0.5),
                                   torch::nn::Linear(64, 10));
  Workload workload(WorkloadOptions().input_shape({1, 8, 8}).classes(10).seed(3)
                        .device(c10::Device(c10::kCUDA, 0)),
                    make_module_model("dropout", net));
  TrialRunner runner(workload, *memory);
  torch::manual_seed(11);
  const auto expected = torch::rand({8}, torch::TensorOptions().device(torch::kCUDA)).cpu();
  torch::manual_seed(11);
  ASSERT_TRUE(runner.run(TrialOptions().batch_size(2)).fits);
  const auto after = torch::rand({8}, torch::TensorOptions().device(torch::kCUDA)).cpu();
  EXPECT_TRUE(torch::equal(expected, after));
}

}  // namespace
}  // namespace batchtune
