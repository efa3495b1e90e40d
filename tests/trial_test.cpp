#include "batchtune/step/training_step.h"
#include "batchtune/step/trial.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "batchtune/memory/budget_allocator.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/common/error.h"
#include "batchtune/step/workload.h"
#include "batchtune/models/module_model.h"
#include "fake_clock.h"
#include "test_helpers.h"

namespace {

using batchtune::testing::copies;
using batchtune::testing::expect_identical;

using namespace batchtune;

constexpr int64_t kMiB = int64_t{1} << 20;


/// Adam's state, per parameter, as plain tensors.
std::vector<torch::Tensor> adam_state(Workload& workload) {
  std::vector<torch::Tensor> out;
  for (const auto& p : workload.model().parameters()) {
    auto& state = workload.optimizer().state();
    auto it = state.find(p.unsafeGetTensorImpl());
    if (it == state.end()) continue;
    auto& adam = static_cast<torch::optim::AdamParamState&>(*it->second);
    out.push_back(torch::tensor(adam.step()));
    out.push_back(adam.exp_avg().clone());
    out.push_back(adam.exp_avg_sq().clone());
  }
  return out;
}

struct Fixture {
  explicit Fixture(const std::string& model, int64_t limit = 256 * kMiB)
      : memory(make_device_memory(c10::Device(c10::kCPU), limit)),
        workload(WorkloadOptions().model(model).input_shape({3, 32, 32}).seed(7)) {}
  std::unique_ptr<DeviceMemory> memory;
  Workload workload;
};

TEST(TrialRunner, FittingTrialMeasuresAndLeavesNoTrace) {
  Fixture f("resnet18", 1024 * kMiB);  // has batch-norm buffers
  // Some optimizer state before the trial, as in a run that is under way.
  TrainingStep(f.workload, c10::Device(c10::kCPU)).run(f.workload.synthetic_batch(4));
  const auto params = copies(f.workload.model().parameters());
  const auto buffers = copies(f.workload.model().buffers());
  const auto state = adam_state(f.workload);
  ASSERT_FALSE(state.empty());
  const auto rng = at::detail::getDefaultCPUGenerator().get_state();
  const int64_t live = f.memory->live_bytes();

  TrialRunner runner(f.workload, *f.memory, 0.1);
  const TrialResult r = runner.run(TrialOptions().batch_size(8).steps(2).warmup_steps(1));
  EXPECT_TRUE(r.fits) << r.error;
  EXPECT_TRUE(r.error.empty());
  EXPECT_EQ(r.steps_run, 3);
  EXPECT_EQ(r.step_seconds.size(), 2u);
  EXPECT_GT(r.peak_bytes, live);
  EXPECT_LE(r.peak_bytes, r.usable_bytes);
  EXPECT_EQ(r.capacity_bytes, 1024 * kMiB);
  EXPECT_EQ(r.usable_bytes, static_cast<int64_t>(1024 * kMiB * 0.9));
  EXPECT_GT(r.samples_per_s, 0);
  EXPECT_NEAR(r.samples_per_s, 8 / (r.step_ms / 1e3), 1e-6);

  expect_identical(f.workload.model().parameters(), params);
  expect_identical(f.workload.model().buffers(), buffers);
  expect_identical(adam_state(f.workload), state);
  for (const auto& p : f.workload.model().parameters()) EXPECT_FALSE(p.grad().defined());
  EXPECT_EQ(f.memory->live_bytes(), live);
  EXPECT_TRUE(torch::equal(at::detail::getDefaultCPUGenerator().get_state(), rng));
}

TEST(TrialRunner, OutOfMemoryBecomesAResultAndLeavesNoTrace) {
  Fixture f("convnet", 24 * kMiB);
  const auto params = copies(f.workload.model().parameters());
  const int64_t live = f.memory->live_bytes();
  ASSERT_TRUE(f.workload.optimizer().state().empty());

  TrialRunner runner(f.workload, *f.memory);
  const TrialResult r = runner.run(TrialOptions().batch_size(512));
  EXPECT_FALSE(r.fits);
  EXPECT_EQ(r.failure, TrialFailure::kOutOfMemory);
  EXPECT_NE(r.error.find("out of memory"), std::string::npos) << r.error;
  EXPECT_EQ(r.error.find('\n'), std::string::npos);
  EXPECT_LE(r.peak_bytes, r.usable_bytes);

  expect_identical(f.workload.model().parameters(), params);
  EXPECT_TRUE(f.workload.optimizer().state().empty());  // the first step's state is gone
  for (const auto& p : f.workload.model().parameters()) EXPECT_FALSE(p.grad().defined());
  EXPECT_EQ(f.memory->live_bytes(), live);

  // And a size that fits still runs afterwards.
  EXPECT_TRUE(runner.run(TrialOptions().batch_size(2)).fits);
}

TEST(TrialRunner, CountsOptimizerStateCreatedByTheFirstStep) {
  Fixture f("mlp");
  TrialRunner runner(f.workload, *f.memory);
  const int64_t params = parameter_bytes(f.workload.model());
  const TrialResult r = runner.run(TrialOptions().batch_size(1).steps(1));
  ASSERT_TRUE(r.fits);
  // Parameters + gradients + Adam's two moments, at least.
  EXPECT_GE(r.peak_bytes, 4 * params);
}

TEST(TrialRunner, PeakGrowsWithBatchSize) {
  Fixture f("convnet");
  TrialRunner runner(f.workload, *f.memory);
  const TrialResult small = runner.run(TrialOptions().batch_size(4));
  const TrialResult big = runner.run(TrialOptions().batch_size(64));
  ASSERT_TRUE(small.fits && big.fits);
  EXPECT_GT(big.peak_bytes, small.peak_bytes);
  EXPECT_EQ(runner.total_steps(), 8);
}

TEST(TrialRunner, RejectsBadOptions) {
  Fixture f("mlp");
  EXPECT_THROW(TrialRunner(f.workload, *f.memory, 1.0), Error);
  EXPECT_THROW(TrialRunner(f.workload, *f.memory, -0.1), Error);
  TrialRunner runner(f.workload, *f.memory);
  EXPECT_THROW(runner.run(TrialOptions().batch_size(0)), Error);
  EXPECT_THROW(runner.run(TrialOptions().batch_size(1).steps(0)), Error);
}

TEST(TrialStatistics, MedianAndSpread) {
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median({4, 1, 2, 3}), 2.5);
  EXPECT_DOUBLE_EQ(median({}), 0);
  EXPECT_DOUBLE_EQ(relative_spread({1, 1, 1}), 0);
  EXPECT_NEAR(relative_spread({1, 2, 3, 4, 5}), 2.0 / 3.0, 1e-12);
}

TEST(DeviceMemory, UnknownOrMissingDevicesAreUserErrors) {
  EXPECT_THROW(parse_device("gpu"), Error);
  EXPECT_THROW(parse_device("cuda:x"), Error);
  EXPECT_EQ(parse_device("cpu"), c10::Device(c10::kCPU));
  if (!torch::cuda::is_available()) {
    EXPECT_THROW(parse_device("cuda"), Error);
    EXPECT_EQ(parse_device("auto"), c10::Device(c10::kCPU));
  }
}

TEST(TrialRunner, FitsAndOverflowsOnTheGpu_CUDA) {
  // 2 GiB: on the first GPU run (an H200, CUDA 13) the CUDA context and the
  // cuDNN and cuBLAS handles alone took 527 to 749 MiB outside the caching
  // allocator, so 512 MiB left nothing for training and the tune refused it.
  auto memory = make_device_memory(c10::Device(c10::kCUDA, 0), 2048 * kMiB);
  Workload workload(WorkloadOptions().model("resnet18").device(c10::Device(c10::kCUDA, 0)));
  TrialRunner runner(workload, *memory);
  EXPECT_TRUE(runner.run(TrialOptions().batch_size(8)).fits);
  const TrialResult big = runner.run(TrialOptions().batch_size(4096));
  EXPECT_FALSE(big.fits);
}

}  // namespace

namespace {

TEST(TrialRunner, BatchNormAtBatchOneDoesNotRunAndIsNoError) {
  using namespace batchtune;
  auto memory = make_device_memory(c10::Device(c10::kCPU), 1024 * kMiB);
  Workload workload(WorkloadOptions().model("resnet18").input_shape({3, 32, 32}));
  const auto params = copies(workload.model().parameters());
  TrialRunner runner(workload, *memory);
  const TrialResult r = runner.run(TrialOptions().batch_size(1));
  EXPECT_FALSE(r.fits);
  EXPECT_EQ(r.failure, TrialFailure::kDoesNotRun);
  EXPECT_NE(r.error.find("value per channel"), std::string::npos) << r.error;
  expect_identical(workload.model().parameters(), params);
  EXPECT_TRUE(runner.run(TrialOptions().batch_size(2)).fits);
}

TEST(TrialRunner, ANonFiniteLossIsAnErrorNotASizeLimit) {
  Fixture f("convnet");
  const auto params = copies(f.workload.model().parameters());
  TrialRunner runner(f.workload, *f.memory);
  const auto nan_batch = [&](int64_t size) {
    Batch b = f.workload.synthetic_batch(size);
    b.inputs[0].fill_(std::numeric_limits<float>::quiet_NaN());
    return b;
  };
  try {
    runner.run(TrialOptions().batch_size(4).batch_source(nan_batch));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a size limit"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("batch 4"), std::string::npos) << e.what();
  }
  expect_identical(f.workload.model().parameters(), params);
  EXPECT_TRUE(runner.run(TrialOptions().batch_size(4)).fits);
}

}  // namespace

namespace {

using namespace batchtune;

/// A subject whose steps take scripted times on a fake clock: the first
/// ones slow (kernels being built), then steady.
class ScriptedSubject final : public TrialSubject {
 public:
  ScriptedSubject(batchtune::testing::FakeClock& clock, std::vector<double> first_ms, double steady_ms)
      : clock_(clock), first_ms_(std::move(first_ms)), steady_ms_(steady_ms) {}
  std::string describe() const override { return "scripted"; }
  void save() override {}
  void prepare(int64_t) override {}
  at::Tensor step() override {
    const double ms = steps < first_ms_.size() ? first_ms_[steps] : steady_ms_;
    ++steps;
    clock_.advance(ms / 1e3);
    return at::ones({});
  }
  void restore() override {}
  size_t steps = 0;

 private:
  batchtune::testing::FakeClock& clock_;
  std::vector<double> first_ms_;
  double steady_ms_;
};

/// An fp16 subject whose loss scaler skips the first `skips` steps.
class SkippingSubject final : public TrialSubject {
 public:
  explicit SkippingSubject(size_t skips) : skips_(skips) {}
  std::string describe() const override { return "skipping"; }
  AmpMode amp() const override { return AmpMode::kFp16; }
  void save() override {}
  void prepare(int64_t) override {}
  at::Tensor step() override {
    ++steps;
    return at::ones({});
  }
  bool last_step_skipped() const override { return steps <= skips_; }
  void restore() override {}
  size_t steps = 0;

 private:
  size_t skips_;
};

TEST(TrialRunner, Fp16WarmsUpUntilTheLossScalerTakesAStep) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  SkippingSubject subject(3);
  TrialRunner runner(subject, *memory);
  // No warm-up asked for: fp16 still warms up, past the three skipped steps.
  const TrialResult r = runner.run(TrialOptions().batch_size(2).steps(2).warmup_steps(0));
  ASSERT_TRUE(r.fits) << r.error;
  EXPECT_EQ(r.warmup_steps_run, 4);
  EXPECT_EQ(r.step_seconds.size(), 2u);

  // A scaler that never takes a step gives up after the cap.
  SkippingSubject never(1000);
  TrialRunner stuck(never, *memory);
  const TrialResult s = stuck.run(TrialOptions().batch_size(2).steps(1).warmup_steps(0));
  EXPECT_EQ(s.warmup_steps_run, 1 + kMaxSkippedWarmupSteps);
}

TEST(WorkloadTrial, Fp16CarriesTheLossScaleFromTrialToTrial) {
  // Four equal logits w × 1e34 at batch 1: the cross-entropy's gradient on
  // the label's logit is -0.75 × 1e34 whatever the label, so the scaled
  // gradient overflows fp32 at the scale of 2^16 (4.9e38) and not at 2^15
  // (2.5e38). The product is elementwise: autocast leaves it in fp32. The
  // lr keeps w where it is.
  auto weight = std::make_shared<torch::nn::Module>();
  auto w = weight->register_parameter("w", torch::full({4}, 0.5));
  auto model = std::make_unique<ModuleModel>(
      "overflowing", weight, [w](const std::vector<at::Tensor>& inputs) {
        return (w * 1e34).expand({inputs.at(0).size(0), 4});
      });
  Workload workload(WorkloadOptions().input_shape({1, 2, 2}).classes(4).seed(5).optimizer("sgd").lr(1e-40),
                    std::move(model));
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  WorkloadTrial trial(workload, c10::Device(c10::kCPU), AmpMode::kFp16);
  TrialRunner runner(trial, *memory);
  const TrialResult first = runner.run(TrialOptions().batch_size(1).steps(2).warmup_steps(0));
  ASSERT_TRUE(first.fits) << first.error;
  EXPECT_EQ(first.warmup_steps_run, 2);  // one skipped at 2^16, one taken at 2^15
  ASSERT_TRUE(trial.loss_scale().has_value());
  EXPECT_EQ(*trial.loss_scale(), 32768.0);
  // The next trial starts at 2^15: no step skipped, the one warm-up asked for.
  const TrialResult second = runner.run(TrialOptions().batch_size(1).steps(2).warmup_steps(1));
  ASSERT_TRUE(second.fits) << second.error;
  EXPECT_EQ(second.warmup_steps_run, 1);
  EXPECT_EQ(*trial.loss_scale(), 32768.0);
}

TEST(TrialRunner, WarmsUpUntilTheStepTimeSettlesThenFillsTheMinimumTime) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  batchtune::testing::FakeClock clock;
  ScriptedSubject subject(clock, {400, 200, 100, 20}, 10);
  TrialRunner runner(subject, *memory);
  runner.set_clock(clock);
  const TrialResult r = runner.run(
      TrialOptions().batch_size(8).steps(5).warmup_steps(1).max_warmup_steps(10).min_time_s(0.5));
  ASSERT_TRUE(r.fits) << r.error;
  // 400, 200, 100, 20, 10 each fall by more than 10 %; the sixth step (10
  // after 10) is the first that has settled.
  EXPECT_EQ(r.warmup_steps_run, 6);
  EXPECT_NEAR(static_cast<double>(r.step_seconds.size()), 50, 1) << "0.5 s of 10 ms steps";
  EXPECT_NEAR(r.step_ms, 10, 1e-9);
  EXPECT_NEAR(r.step_ms_ci.low, 10, 1e-9);
  EXPECT_NEAR(r.step_ms_ci.high, 10, 1e-9);
  EXPECT_GE(r.step_ms_ci.level, kConfidenceLevel);
  EXPECT_NEAR(r.samples_per_s_ci.median, 800, 1e-6);
  EXPECT_FALSE(r.noisy);
}

TEST(TrialRunner, NeverRunsPastItsSliceBeyondTheMinimumMeasurement) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  batchtune::testing::FakeClock clock;
  ScriptedSubject subject(clock, {}, 100);
  TrialRunner runner(subject, *memory);
  runner.set_clock(clock);
  const TrialResult r = runner.run(TrialOptions()
                                       .batch_size(8)
                                       .steps(5)
                                       .warmup_steps(1)
                                       .max_warmup_steps(10)
                                       .min_time_s(1)
                                       .max_time_s(0.35));
  ASSERT_TRUE(r.fits);
  EXPECT_LE(clock.now_s(), 0.35 + 1e-9) << "no step that would end past the slice";
  EXPECT_EQ(r.warmup_steps_run, 1) << "settling warm-up keeps to half the slice";
  EXPECT_EQ(r.step_seconds.size(), 2U);
  // A slice shorter than one step still measures: the warm-up and one timed step.
  batchtune::testing::FakeClock other;
  ScriptedSubject slow(other, {}, 100);
  TrialRunner tight(slow, *memory);
  tight.set_clock(other);
  const TrialResult minimum =
      tight.run(TrialOptions().batch_size(8).steps(5).min_time_s(1).max_time_s(0.01));
  EXPECT_EQ(minimum.step_seconds.size(), 1U);
  EXPECT_EQ(minimum.steps_run, 2);
  EXPECT_TRUE(minimum.noisy) << "one reading is no interval";
}

}  // namespace
