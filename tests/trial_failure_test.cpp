#include "batchtune/step/trial_failure.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

#include "batchtune/memory/device_memory.h"
#include "batchtune/models/module_model.h"
#include "batchtune/plan/plan.h"
#include "batchtune/step/trial.h"
#include "batchtune/step/workload.h"
#include "batchtune/training/trainer.h"
#include "counting_memory.h"
#include "test_helpers.h"

namespace batchtune {
namespace {

using testing::copies;
using testing::CountingMemory;
using testing::expect_identical;

constexpr int64_t kMiB = int64_t{1} << 20;
// cuDNN's engine search, after the caching allocator refused every
// workspace (Conv_v8.cpp), as LibTorch 2.x words it.
constexpr const char* kCudnnNoEngine =
    "GET was unable to find an engine to execute this computation";

StepFailureEvidence evidence(bool oom_type, std::string message, int64_t before, int64_t after) {
  StepFailureEvidence e;
  e.out_of_memory_error = oom_type;
  e.message = std::move(message);
  e.ooms_before = before;
  e.ooms_after = after;
  return e;
}

TEST(ClassifyStepFailure, AnOutOfMemoryErrorIsMemory) {
  EXPECT_EQ(classify_step_failure(evidence(true, "CUDA out of memory. Tried to allocate", 0, 0)),
            StepFailure::kOutOfMemory);
}

TEST(ClassifyStepFailure, TheCounterRisingMakesAnyMessageMemory) {
  EXPECT_EQ(classify_step_failure(evidence(false, kCudnnNoEngine, 3, 4)),
            StepFailure::kOutOfMemory);
  EXPECT_EQ(classify_step_failure(evidence(false, "some wrapped library error", 0, 2)),
            StepFailure::kOutOfMemory);
  // Even over a message that would otherwise be a size refusal.
  EXPECT_EQ(classify_step_failure(evidence(false, "CUDNN_STATUS_NOT_SUPPORTED", 1, 2)),
            StepFailure::kOutOfMemory);
}

TEST(ClassifyStepFailure, WithoutTheCounterTheMessageDecides) {
  EXPECT_EQ(classify_step_failure(evidence(false, kCudnnNoEngine, 4, 4)), StepFailure::kError);
  EXPECT_EQ(classify_step_failure(evidence(false, "CUDA error: out of memory\nCUDA kernel...", 0, 0)),
            StepFailure::kOutOfMemory);
  EXPECT_EQ(classify_step_failure(evidence(
                false, "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)",
                0, 0)),
            StepFailure::kOutOfMemory);
  EXPECT_EQ(classify_step_failure(evidence(
                false, "Expected more than 1 value per channel when training, got input size",
                0, 0)),
            StepFailure::kSizeRefusal);
  EXPECT_EQ(classify_step_failure(evidence(false, "CUDA error: invalid configuration argument", 0,
                                           0)),
            StepFailure::kSizeRefusal);
  EXPECT_EQ(classify_step_failure(evidence(
                false, "mat1 and mat2 shapes cannot be multiplied (4x10 and 12x3)", 0, 0)),
            StepFailure::kError);
}

TEST(ClassifyStepFailure, ReadsTheTypeOfACaughtError) {
  try {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "Tried to allocate 2.00 GiB");
  } catch (const c10::Error& e) {
    EXPECT_EQ(classify_step_failure(e, 0, 0), StepFailure::kOutOfMemory);
  }
  try {
    TORCH_CHECK(false, kCudnnNoEngine);
  } catch (const c10::Error& e) {
    EXPECT_EQ(classify_step_failure(e, 0, 0), StepFailure::kError);
    EXPECT_EQ(classify_step_failure(e, 0, 1), StepFailure::kOutOfMemory);
  }
}

struct Fixture {
  Fixture()
      : counting(make_device_memory(c10::Device(c10::kCPU), 512 * kMiB)),
        workload(WorkloadOptions().model("convnet").input_shape({3, 32, 32}).seed(7)) {}
  CountingMemory counting;
  Workload workload;
};

/// A batch source that fails the way cuDNN does past `largest`: the
/// allocator refuses the workspace (its counter rises) and the error that
/// reaches batchtune is a plain c10::Error.
BatchSource cudnn_like(Fixture& f, int64_t largest, bool counts) {
  return [&f, largest, counts](int64_t size) {
    if (size > largest) {
      if (counts) f.counting.count_oom();
      TORCH_CHECK(false, kCudnnNoEngine);
    }
    return f.workload.synthetic_batch(size);
  };
}

TEST(TrialRunner, AnErrorAfterTheAllocatorCountedAnOutOfMemoryIsOutOfMemory) {
  Fixture f;
  const auto params = copies(f.workload.model().parameters());
  TrialRunner runner(f.workload, f.counting);
  const TrialResult big = runner.run(TrialOptions().batch_size(32).batch_source(cudnn_like(f, 8, true)));
  EXPECT_FALSE(big.fits);
  EXPECT_EQ(big.failure, TrialFailure::kOutOfMemory);
  EXPECT_NE(big.error.find("unable to find an engine"), std::string::npos) << big.error;
  expect_identical(f.workload.model().parameters(), params);
  const TrialResult small = runner.run(TrialOptions().batch_size(8).batch_source(cudnn_like(f, 8, true)));
  EXPECT_TRUE(small.fits) << small.error;
}

TEST(TrialRunner, TheSameErrorWithoutTheCounterIsAnError) {
  Fixture f;
  const auto params = copies(f.workload.model().parameters());
  TrialRunner runner(f.workload, f.counting);
  EXPECT_THROW(runner.run(TrialOptions().batch_size(32).batch_source(cudnn_like(f, 8, false))),
               c10::Error);
  expect_identical(f.workload.model().parameters(), params);
}

/// A batch source that fails as a Python step reaches the runner: an
/// exception that is no c10::Error (py::error_already_set), saying
/// `message`, after the allocator counted a refusal when `counts`.
BatchSource foreign_error(Fixture& f, int64_t largest, bool counts, std::string message) {
  return [&f, largest, counts, message](int64_t size) {
    if (size > largest) {
      if (counts) f.counting.count_oom();
      throw std::runtime_error(message);
    }
    return f.workload.synthetic_batch(size);
  };
}

TEST(TrialRunner, AnErrorThatIsNoLibTorchErrorIsClassifiedTheSameWay) {
  Fixture f;
  const auto params = copies(f.workload.model().parameters());
  TrialRunner runner(f.workload, f.counting);
  // The counter rose: memory, whatever the message.
  const TrialResult counted = runner.run(TrialOptions().batch_size(32).batch_source(
      foreign_error(f, 8, true, std::string(kCudnnNoEngine) + "\nTraceback")));
  EXPECT_FALSE(counted.fits);
  EXPECT_EQ(counted.failure, TrialFailure::kOutOfMemory);
  EXPECT_EQ(counted.error, kCudnnNoEngine);
  expect_identical(f.workload.model().parameters(), params);
  // "CUDA error: out of memory" from a cudaMalloc outside the allocator: no
  // counter saw it, the message says it.
  const TrialResult named = runner.run(TrialOptions().batch_size(32).batch_source(
      foreign_error(f, 8, false, "CUDA error: out of memory\nCompile with TORCH_USE_CUDA_DSA")));
  EXPECT_FALSE(named.fits);
  EXPECT_EQ(named.failure, TrialFailure::kOutOfMemory);
  EXPECT_EQ(named.error, "CUDA error: out of memory");
  EXPECT_TRUE(runner.run(TrialOptions().batch_size(8).batch_source(
                             foreign_error(f, 8, true, kCudnnNoEngine))).fits);
  // Neither: the user's error, passed on unchanged, the state put back.
  EXPECT_THROW(runner.run(TrialOptions().batch_size(32).batch_source(
                   foreign_error(f, 8, false, kCudnnNoEngine))),
               std::runtime_error);
  expect_identical(f.workload.model().parameters(), params);
}

TEST(TrialRunner, OnlyASearchsTrialKeepsTheFragmentationReserve) {
  // Tensors that went into the share of the cap kept for fragmentation: the
  // batch ran (a probe fits), but a search may not call it its largest.
  Fixture f;
  f.counting.set_reserve_used(3 * kMiB);
  TrialRunner runner(f.workload, f.counting);
  EXPECT_TRUE(runner.run(TrialOptions().batch_size(4)).fits);
  const TrialResult searched =
      runner.run(TrialOptions().batch_size(4).keep_fragmentation_reserve(true));
  EXPECT_FALSE(searched.fits);
  EXPECT_EQ(searched.failure, TrialFailure::kOverBudget);
  EXPECT_NE(searched.error.find("search keeps for its fragmentation"), std::string::npos)
      << searched.error;
  f.counting.set_reserve_used(0);
  EXPECT_TRUE(runner.run(TrialOptions().batch_size(4).keep_fragmentation_reserve(true)).fits);
}

TEST(Trainer, RecoversFromAnOutOfMemoryThatOnlyTheCounterSaw) {
  CountingMemory counting(make_device_memory(c10::Device(c10::kCPU), 512 * kMiB));
  constexpr int64_t kLargest = 16;
  auto net = torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(28 * 28, 10));
  auto model = std::make_unique<ModuleModel>(
      "counted", net.ptr(), [net, &counting](const std::vector<at::Tensor>& inputs) mutable {
        if (inputs.at(0).size(0) > kLargest) {
          counting.count_oom();
          TORCH_CHECK(false, kCudnnNoEngine);
        }
        return net->forward(inputs.at(0));
      });
  Workload w(WorkloadOptions().input_shape({1, 28, 28}).classes(10).seed(7), std::move(model));
  const auto data = testing::toy_data({1, 28, 28}, 64 * 4, 10, 3);
  Trainer trainer(w, counting, make_plan(PlanOptions().micro_batch_size(64).base_lr(1e-3)), *data,
                  nullptr, TrainOptions().steps(3));
  const TrainSummary s = trainer.run();
  EXPECT_GE(s.oom_recoveries, 1);
  EXPECT_LE(s.micro_batch_size, kLargest);
  EXPECT_EQ(s.micro_batch_size * s.accumulation_steps, 64);
  EXPECT_EQ(s.steps, 3);
  EXPECT_TRUE(std::isfinite(s.final_loss));
}

TEST(Trainer, AnErrorThatIsNotMemoryStillStopsTraining) {
  CountingMemory counting(make_device_memory(c10::Device(c10::kCPU), 512 * kMiB));
  auto net = torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(28 * 28, 10));
  auto model = std::make_unique<ModuleModel>(
      "broken", net.ptr(), [net](const std::vector<at::Tensor>& inputs) mutable {
        // Workload's own check runs at batch 2; the failure comes later.
        TORCH_CHECK(inputs.at(0).size(0) <= 4, kCudnnNoEngine);
        return net->forward(inputs.at(0));
      });
  Workload w(WorkloadOptions().input_shape({1, 28, 28}).classes(10).seed(7), std::move(model));
  const auto data = testing::toy_data({1, 28, 28}, 64, 10, 3);
  Trainer trainer(w, counting, make_plan(PlanOptions().micro_batch_size(16)), *data, nullptr,
                  TrainOptions().steps(1));
  EXPECT_THROW(trainer.run(), c10::Error);
}

}  // namespace
}  // namespace batchtune
