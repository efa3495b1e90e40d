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
  int current_device = 0;   ///< the thread's current device
  int cache_empties = 0;
  bool restored_without_context = false;  ///< the last set_current_device was a restore
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
  double memory_fraction() const override { return state_.fraction < 0 ? 1.0 : state_.fraction; }
  int current_device() const override { return state_.current_device; }
  void set_current_device(int index, bool restore) override {
    state_.current_device = index;
    state_.restored_without_context = restore;
  }
  void reset_peak_stats() override {
    ++state_.peak_resets;
    state_.stats.reserved_peak = state_.stats.reserved_current;
    state_.stats.allocated_peak = state_.stats.allocated_current;
  }
  void empty_cache() override {
    ++state_.cache_empties;
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

/// One step as the trial runner brackets it: synchronize, the step,
/// synchronize. `outside` MiB appear outside the allocator during it.
void fake_step(DeviceMemory& memory, FakeDeviceState& state, int64_t outside) {
  memory.synchronize();
  state.used += outside;
  memory.synchronize();
}

TEST(CachingAllocatorMemory, TheOutsideBaselineIsFrozenAfterTheFirstStepSoTheCapHolds) {
  FakeDeviceState state;
  state.used = 500 * kMiB;
  auto memory = fake_memory(state, 8 * kGiB);
  const int64_t cold_cap = cap_bytes(state);
  memory->reset_peak();
  const int empties = state.cache_empties;
  fake_step(*memory, state, 300 * kMiB);  // the first step loads kernels and handles
  // The cap follows once, at the end of the first step, and the blocks that
  // step cached under the larger cap go back.
  const int64_t cap = cap_bytes(state);
  EXPECT_NEAR(cold_cap - cap, 300 * kMiB, 1.0);
  EXPECT_EQ(state.cache_empties, empties + 1);
  for (int trial = 0; trial < 3; ++trial) {
    memory->reset_peak();
    state.used += 20 * kMiB;  // later trials leave a little behind
    fake_step(*memory, state, 0);
    EXPECT_EQ(cap_bytes(state), cap) << "trial " << trial << ": the cap no longer moves";
  }
  EXPECT_EQ(state.cache_empties, empties + 1);  // frozen once
  // What grew since still counts in a trial's peak.
  EXPECT_EQ(memory->peak_bytes(), 800 * kMiB + 60 * kMiB);
}

TEST(CachingAllocatorMemory, AFreshProbeGetsTheCapTheSearchHad) {
  // A search, then a probe of its answer in a fresh memory object (the CLI's
  // probe, a new Python process): both freeze after their first step, so
  // the steps that are timed and checked run under one cap, whatever the
  // first trial's batch.
  FakeDeviceState search_state;
  search_state.used = 500 * kMiB;
  auto search = fake_memory(search_state, 16 * kGiB);
  search->reset_peak();
  fake_step(*search, search_state, 250 * kMiB);  // batch 1: kernels load
  search->reset_peak();
  fake_step(*search, search_state, 0);           // the boundary's trial
  const int64_t search_cap = cap_bytes(search_state);

  FakeDeviceState probe_state;
  probe_state.used = 500 * kMiB;
  auto probe = fake_memory(probe_state, 16 * kGiB);
  probe->reset_peak();
  EXPECT_GT(cap_bytes(probe_state), search_cap);  // before any step: the cold cap
  fake_step(*probe, probe_state, 250 * kMiB);
  EXPECT_EQ(cap_bytes(probe_state), search_cap);
}

/// An 8 GiB limit with 500 MiB used outside the allocator, after the first
/// step (the outside memory frozen, the cap set).
std::unique_ptr<DeviceMemory> after_first_step(FakeDeviceState& state) {
  state.used = 500 * kMiB;
  auto memory = fake_memory(state, 8 * kGiB);
  memory->reset_peak();
  fake_step(*memory, state, 0);
  return memory;
}

TEST(CachingAllocatorMemory, ReservedAboveTheCapIsOverBudgetWhateverTheHeadroomLeft) {
  FakeDeviceState state;
  auto memory = after_first_step(state);
  const int64_t cap = cap_bytes(state);
  memory->reset_peak();
  // The allocator held 100 MiB above its cap (blocks kept from before the
  // cap was set) while nothing grew outside: peak <= usable, yet over.
  state.stats.reserved_current = cap + 100 * kMiB;
  state.stats.reserved_peak = cap + 100 * kMiB;
  state.used += cap + 100 * kMiB;
  memory->synchronize();
  EXPECT_LE(memory->peak_bytes(), memory->usable_bytes());
  EXPECT_NEAR(static_cast<double>(memory->over_budget_bytes()), 100.0 * kMiB, 1.0 * kMiB);
  // Within the cap, and outside growth within the headroom: not over.
  state.used -= state.stats.reserved_current;
  state.stats.reserved_current = cap - kMiB;
  state.used += state.stats.reserved_current;
  memory->reset_peak();
  state.used += 200 * kMiB;
  memory->synchronize();
  EXPECT_EQ(memory->over_budget_bytes(), 0);
  // Outside growth past the headroom is over by what it passed it by.
  state.used += 100 * kMiB;
  memory->synchronize();
  EXPECT_EQ(memory->over_budget_bytes(), 300 * kMiB - kCudaOutsideGrowthBytes);
}

TEST(CachingAllocatorMemory, SaysHowFarTheTensorsWentIntoTheFragmentationReserve) {
  FakeDeviceState state;
  auto memory = after_first_step(state);
  const int64_t cap = cap_bytes(state);
  const auto allocate_peak = [&](double share_of_cap) {
    memory->reset_peak();
    const auto bytes = static_cast<int64_t>(share_of_cap * static_cast<double>(cap));
    state.stats.allocated_peak = bytes;
    state.stats.reserved_peak = std::min(cap, bytes + 30 * kMiB);  // within the cap either way
    memory->synchronize();
  };
  // Below the cap less the reserve: none of it used, and within the cap.
  allocate_peak(1 - kCudaFragmentationReserve - 0.01);
  EXPECT_EQ(memory->reserve_used_bytes(), 0);
  // Tensors that needed 99 % of the cap ran, by how the blocks split: within
  // the cap (a probe's question), but into the reserve (a search's) by what
  // they took of it.
  allocate_peak(0.99);
  EXPECT_EQ(memory->over_budget_bytes(), 0);
  EXPECT_NEAR(static_cast<double>(memory->reserve_used_bytes()),
              (0.99 - (1 - kCudaFragmentationReserve)) * static_cast<double>(cap), 1.0 * kMiB);
}

TEST(CachingAllocatorMemory, PutsBackTheCapAndTheCurrentDeviceItFound) {
  FakeDeviceState state;
  state.current_device = 0;
  {
    auto memory = fake_memory(state, 8 * kGiB, 2);
    EXPECT_EQ(state.current_device, 2);  // the tuned device is current while it lives
    EXPECT_FALSE(state.restored_without_context);
    EXPECT_LT(state.fraction, 0.2);      // capped at 8 of 80 GiB
  }
  EXPECT_EQ(state.fraction, 1.0);  // no cap, as before
  EXPECT_EQ(state.current_device, 0);
  EXPECT_TRUE(state.restored_without_context);  // no context made on device 0

  // A cap the user had set stays theirs.
  state.fraction = 0.5;
  { auto memory = fake_memory(state, 4 * kGiB, 0); }
  EXPECT_EQ(state.fraction, 0.5);
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
