#include "batchtune/training/trainer.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>

#include "batchtune/memory/budget_allocator.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/reports/train_reporter.h"
#include "batchtune/step/workload.h"
#include "fake_clock.h"
#include "test_helpers.h"

namespace batchtune {
namespace {

constexpr int64_t kMemoryLimit = int64_t{1} << 30;

using testing::toy_data;

Workload make_workload(const std::string& model, std::vector<int64_t> shape, int64_t classes) {
  return Workload(WorkloadOptions().model(model).input_shape(shape).classes(classes).seed(7));
}

std::vector<at::Tensor> gradients(Workload& w) {
  std::vector<at::Tensor> grads;
  for (const auto& p : w.model().parameters()) grads.push_back(p.grad().clone());
  return grads;
}

TEST(Trainer, AccumulatedMicroBatchesGiveTheGradientsOfOneBatch) {
  const auto data = toy_data({1, 12, 12}, 48, 5, 1);
  std::vector<int64_t> indices(48);
  for (int64_t i = 0; i < 48; ++i) indices[static_cast<size_t>(i)] = 47 - i;
  std::vector<std::vector<at::Tensor>> results;
  std::vector<double> losses;
  for (int64_t micro : {48, 12, 5}) {  // one batch; 4 x 12; 9 x 5 + 3 (uneven)
    Workload w = make_workload("lenet", {1, 12, 12}, 5);
    TrainingStep step(w, c10::Device(c10::kCPU), StepOptions().micro_batch_size(micro));
    losses.push_back(step.backward(data->get_batch(indices)).item<double>());
    results.push_back(gradients(w));
  }
  for (size_t r = 1; r < results.size(); ++r) {
    EXPECT_NEAR(losses[r], losses[0], 1e-5);
    for (size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_TRUE(at::allclose(results[r][i], results[0][i], 1e-4, 1e-6))
          << "micro-batch run " << r << ", parameter " << i << ": max difference "
          << (results[r][i] - results[0][i]).abs().max().item<double>();
    }
  }
}

TEST(Trainer, TrainsEpochsWithATestSplitAndReportsEvents) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto train = toy_data({16}, 512, 4, 2);
  const auto test = toy_data({16}, 128, 4, 12);  // held out: other samples, same map
  Workload w = make_workload("mlp", {16}, 4);
  const Plan plan = make_plan(PlanOptions().micro_batch_size(16).target_batch(32).base_lr(1e-2));
  Trainer trainer(w, *memory, plan, *train, test.get(), TrainOptions().epochs(2).log_every(4));
  int logs = 0;
  int epoch_ends = 0;
  trainer.set_callback([&](const TrainEvent& e) {
    if (e.kind == TrainEvent::Kind::kLog) {
      ++logs;
      EXPECT_GT(e.samples_per_s, 0);
      EXPECT_GT(e.memory_capacity_bytes, 0);
    }
    if (e.kind == TrainEvent::Kind::kEpochEnd) {
      ++epoch_ends;
      EXPECT_TRUE(e.test_accuracy.has_value());
    }
  });
  const TrainSummary s = trainer.run();
  EXPECT_EQ(s.steps, 32);  // 512 / 32 per epoch, 2 epochs
  EXPECT_EQ(s.samples, 1024);
  EXPECT_DOUBLE_EQ(s.epochs, 2.0);
  EXPECT_EQ(s.accumulation_steps, 2);
  EXPECT_EQ(s.global_batch_size, 32);
  EXPECT_EQ(logs, 8);
  EXPECT_EQ(epoch_ends, 2);
  ASSERT_TRUE(s.test_accuracy.has_value());
  EXPECT_GT(*s.test_accuracy, 0.5);  // chance is 0.25
}

TEST(Trainer, OutOfMemoryMidRunKeepsStepsSamplesAndLoss) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto data = toy_data({1, 28, 28}, 64 * 8, 10, 3);
  const Plan plan = make_plan(PlanOptions().micro_batch_size(64).base_lr(1e-3));
  constexpr int64_t kSqueezeAt = 4;

  // The reference run measures what a step at micro-batch 64 needs.
  Workload reference = make_workload("lenet", {1, 28, 28}, 10);
  Trainer a(reference, *memory, plan, *data, nullptr, TrainOptions().steps(8));
  int64_t live_before = 0;
  int64_t step_peak = 0;
  a.set_before_step([&](int64_t step) {
    if (step == kSqueezeAt) {
      live_before = memory->live_bytes();
      memory->reset_peak();
    } else if (step == kSqueezeAt + 1) {
      step_peak = memory->peak_bytes() - live_before;
    }
  });
  const TrainSummary sa = a.run();
  ASSERT_GT(step_peak, 0);

  // The same run, with the budget squeezed below what micro-batch 64 needs.
  Workload squeezed = make_workload("lenet", {1, 28, 28}, 10);
  Trainer b(squeezed, *memory, plan, *data, nullptr, TrainOptions().steps(8));
  std::vector<std::string> messages;
  b.set_callback([&](const TrainEvent& e) {
    if (e.kind == TrainEvent::Kind::kOomRecovery) messages.push_back(e.message);
  });
  b.set_before_step([&](int64_t step) {
    if (step == kSqueezeAt) memory->set_usable_bytes(memory->live_bytes() + step_peak * 6 / 10);
  });
  const TrainSummary sb = b.run();
  memory->set_usable_bytes(kMemoryLimit);

  EXPECT_EQ(sa.oom_recoveries, 0);
  EXPECT_GE(sb.oom_recoveries, 1);
  EXPECT_EQ(messages.size(), static_cast<size_t>(sb.oom_recoveries));
  EXPECT_LT(sb.micro_batch_size, 64);
  EXPECT_EQ(sb.micro_batch_size * sb.accumulation_steps, 64);
  EXPECT_EQ(sb.steps, sa.steps);
  EXPECT_EQ(sb.samples, sa.samples);
  EXPECT_EQ(sb.global_batch_size, sa.global_batch_size);
  EXPECT_NEAR(sb.final_loss, sa.final_loss, 1e-3 * std::abs(sa.final_loss));
  auto pa = reference.model().parameters();
  auto pb = squeezed.model().parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(at::allclose(pa[i], pb[i], 1e-3, 1e-5));
}

TEST(Trainer, OutOfMemoryAtMicroBatchOneStopsWithAClearError) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto data = toy_data({1, 28, 28}, 64, 10, 4);
  Workload w = make_workload("lenet", {1, 28, 28}, 10);
  Trainer trainer(w, *memory, make_plan(PlanOptions().micro_batch_size(4)), *data, nullptr,
                  TrainOptions().steps(4));
  trainer.set_before_step([&](int64_t step) {
    if (step == 1) memory->set_usable_bytes(memory->live_bytes() + 1024);
  });
  try {
    trainer.run();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("micro-batch 1"), std::string::npos) << e.what();
  }
  memory->set_usable_bytes(kMemoryLimit);
}

TEST(Trainer, ResumeFromACheckpointReproducesTheUninterruptedRunExactly) {
  const testing::OneThread one_thread;  // two runs compared bit for bit
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto data = toy_data({1, 12, 12}, 80, 5, 5);  // 5 steps per epoch at 16
  const Plan plan =
      make_plan(PlanOptions().micro_batch_size(8).target_batch(16).base_lr(1e-3).base_batch(8));
  const std::string dir = ::testing::TempDir() + "batchtune_resume_test";
  std::remove((dir + "/" + kCheckpointFile).c_str());
  ::mkdir(dir.c_str(), 0755);

  Workload whole = make_workload("lenet", {1, 12, 12}, 5);
  const TrainSummary s_whole =
      Trainer(whole, *memory, plan, *data, nullptr, TrainOptions().steps(12).seed(3)).run();

  {  // killed after step 7 (mid-epoch), its last checkpoint at step 7
    Workload first = make_workload("lenet", {1, 12, 12}, 5);
    Trainer(first, *memory, plan, *data, nullptr,
            TrainOptions().steps(7).seed(3).checkpoint_dir(dir).checkpoint_every(3))
        .run();
  }
  Workload second = make_workload("lenet", {1, 12, 12}, 5);
  second.optimizer().zero_grad(true);
  for (auto& p : second.model().parameters()) {  // nothing of the fresh model may survive
    at::NoGradGuard no_grad;
    p.normal_();
  }
  Trainer resumed(second, *memory, plan, *data, nullptr,
                  TrainOptions().steps(12).seed(3).checkpoint_dir(dir).resume(true));
  const TrainSummary s_resumed = resumed.run();

  EXPECT_EQ(s_resumed.resumed_from_step, 7);
  EXPECT_EQ(s_resumed.steps, s_whole.steps);
  EXPECT_EQ(s_resumed.samples, s_whole.samples);
  EXPECT_EQ(s_resumed.final_loss, s_whole.final_loss);
  auto a = whole.model().parameters();
  auto b = second.model().parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << "parameter " << i;
}

TEST(Trainer, AnInterruptStopsAfterTheStepWithACheckpointThatResumes) {
  const testing::OneThread one_thread;  // two runs compared bit for bit
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto data = toy_data({1, 12, 12}, 80, 5, 5);
  const Plan plan = make_plan(PlanOptions().micro_batch_size(16).base_lr(1e-3).base_batch(16));
  const std::string dir = ::testing::TempDir() + "batchtune_interrupt_test";
  std::remove((dir + "/" + kCheckpointFile).c_str());

  Workload whole = make_workload("lenet", {1, 12, 12}, 5);
  Trainer(whole, *memory, plan, *data, data.get(), TrainOptions().steps(9).seed(2)).run();

  InterruptHandler interrupts;
  Workload first = make_workload("lenet", {1, 12, 12}, 5);
  Trainer stopped(first, *memory, plan, *data, data.get(),
                  TrainOptions().steps(9).seed(2).checkpoint_dir(dir));
  stopped.set_before_step([](int64_t step) {
    if (step == 2) request_interrupt(SIGINT);  // arrives during step 3
  });
  const TrainSummary partial = stopped.run();
  EXPECT_FALSE(partial.complete);
  EXPECT_EQ(partial.interrupted_by, "SIGINT");
  EXPECT_EQ(partial.steps, 3);
  EXPECT_FALSE(partial.test_accuracy.has_value()) << "no final evaluation when interrupted";

  InterruptHandler fresh;  // a new run starts without the old request
  Workload second = make_workload("lenet", {1, 12, 12}, 5);
  const TrainSummary resumed =
      Trainer(second, *memory, plan, *data, nullptr,
              TrainOptions().steps(9).seed(2).checkpoint_dir(dir).resume(true))
          .run();
  EXPECT_TRUE(resumed.complete);
  EXPECT_EQ(resumed.resumed_from_step, 3);
  auto a = whole.model().parameters();
  auto b = second.model().parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << "parameter " << i;
}

TEST(Trainer, ResumeRefusesACheckpointOfAnotherRun) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto data = toy_data({16}, 64, 4, 6);
  const std::string dir = ::testing::TempDir() + "batchtune_resume_mismatch";
  ::mkdir(dir.c_str(), 0755);
  Workload w = make_workload("mlp", {16}, 4);
  Trainer(w, *memory, make_plan(PlanOptions().micro_batch_size(8)), *data, nullptr,
          TrainOptions().steps(2).checkpoint_dir(dir))
      .run();
  Workload other = make_workload("mlp", {16}, 4);
  Trainer trainer(other, *memory, make_plan(PlanOptions().micro_batch_size(16)), *data, nullptr,
                  TrainOptions().steps(2).checkpoint_dir(dir).resume(true));
  try {
    trainer.run();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--resume"), std::string::npos) << e.what();
  }
}

TEST(Trainer, WarmupSetsTheLearningRatePerOptimizerStep) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto data = toy_data({8}, 64, 3, 7);
  Workload w = make_workload("mlp", {8}, 3);
  Plan plan = make_plan(PlanOptions().micro_batch_size(8).base_lr(0.4).warmup_steps(4));
  Trainer trainer(w, *memory, plan, *data, nullptr, TrainOptions().steps(6));
  std::vector<double> lrs;
  trainer.set_before_step([&](int64_t step) {
    if (step > 0) lrs.push_back(w.optimizer().param_groups()[0].options().get_lr());
  });
  trainer.run();
  lrs.push_back(w.optimizer().param_groups()[0].options().get_lr());
  ASSERT_EQ(lrs.size(), 6U);
  const std::vector<double> expected{0.1, 0.2, 0.3, 0.4, 0.4, 0.4};
  for (size_t i = 0; i < lrs.size(); ++i) EXPECT_DOUBLE_EQ(lrs[i], expected[i]) << i;
}

/// The toy problem of `TrainsEpochsWithATestSplitAndReportsEvents`: 16
/// optimizer steps per epoch at 32, a test split it learns.
struct TargetRun {
  std::vector<int64_t> eval_steps;     ///< steps of the evaluations, in order
  std::vector<double> accuracies;      ///< their test accuracy
  int64_t targets_reached = 0;         ///< kTargetReached events
  TrainSummary summary;
};

TargetRun train_toward(std::optional<double> target, testing::FakeClock& clock) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto train = toy_data({16}, 512, 4, 2);
  const auto test = toy_data({16}, 128, 4, 12);
  Workload w = make_workload("mlp", {16}, 4);
  const Plan plan = make_plan(PlanOptions().micro_batch_size(32).base_lr(1e-2));
  Trainer trainer(w, *memory, plan, *train, test.get(),
                  TrainOptions().epochs(3).seed(4).eval_every(3).target_accuracy(target));
  trainer.set_clock(clock);
  TargetRun run;
  // A training step takes 1 s of the fake clock, an evaluation 100 s: only
  // the steps may count.
  trainer.set_before_step([&](int64_t) { clock.advance(1); });
  trainer.set_callback([&](const TrainEvent& e) {
    if (e.kind == TrainEvent::Kind::kEvaluation || e.kind == TrainEvent::Kind::kEpochEnd) {
      run.eval_steps.push_back(e.step);
      run.accuracies.push_back(e.test_accuracy.value_or(-1));
      clock.advance(100);
    }
    if (e.kind == TrainEvent::Kind::kTargetReached) ++run.targets_reached;
  });
  run.summary = trainer.run();
  return run;
}

TEST(Trainer, ATimeLimitStopsAfterTheStepThatReachesIt) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto train = toy_data({16}, 512, 4, 2);
  Workload w = make_workload("mlp", {16}, 4);
  const Plan plan = make_plan(PlanOptions().micro_batch_size(32).base_lr(1e-2));
  testing::FakeClock clock;
  Trainer trainer(w, *memory, plan, *train, nullptr,
                  TrainOptions().steps(100).time_limit_s(5.5).clock(&clock));
  trainer.set_before_step([&](int64_t) { clock.advance(1); });  // a step: 1 s
  const TrainSummary s = trainer.run();
  EXPECT_EQ(s.steps, 6) << "the step that passed 5.5 s was the sixth";
  EXPECT_TRUE(s.time_limit_reached);
  EXPECT_TRUE(s.complete) << "a time limit is the end asked for, not an interruption";
  EXPECT_TRUE(s.interrupted_by.empty());
  EXPECT_EQ(to_json(s).value("time_limit_reached", false), true);
}

/// `inner`, where reading a batch takes `seconds` of `clock`.
class SlowDataset final : public Dataset {
 public:
  SlowDataset(const Dataset& inner, testing::FakeClock& clock, double seconds)
      : inner_(inner), clock_(clock), seconds_(seconds) {}
  int64_t size() const override { return inner_.size(); }
  Batch get_batch(const std::vector<int64_t>& indices) const override {
    clock_.advance(seconds_);
    return inner_.get_batch(indices);
  }
  Batch draw_batch(const std::vector<int64_t>& indices, uint64_t draw) const override {
    clock_.advance(seconds_);
    return inner_.draw_batch(indices, draw);
  }
  std::vector<int64_t> sample_shape() const override { return inner_.sample_shape(); }
  int64_t classes() const override { return inner_.classes(); }
  std::string describe() const override { return inner_.describe(); }

 private:
  const Dataset& inner_;
  testing::FakeClock& clock_;
  double seconds_;
};

TEST(Trainer, TrainingTimeAndDataWaitsAreReadOnItsClock) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto train = toy_data({16}, 512, 4, 2);
  testing::FakeClock clock(50);
  SlowDataset slow(*train, clock, 0.25);  // a batch takes 0.25 s to read
  Workload w = make_workload("mlp", {16}, 4);
  Plan plan = make_plan(PlanOptions().micro_batch_size(32).base_lr(1e-2));
  plan.workers = 0;  // read on the training thread: each read is waited for
  Trainer trainer(w, *memory, plan, slow, nullptr, TrainOptions().steps(8).clock(&clock));
  trainer.set_before_step([&](int64_t) { clock.advance(1); });  // and computed in 1 s
  const TrainSummary s = trainer.run();
  EXPECT_EQ(s.steps, 8);
  EXPECT_EQ(s.samples, 8 * plan.global_batch_size);
  EXPECT_DOUBLE_EQ(s.seconds, 8 * 1.25);
  EXPECT_DOUBLE_EQ(s.data_wait_fraction, 0.25 / 1.25);
  EXPECT_DOUBLE_EQ(s.samples_per_s, static_cast<double>(s.samples) / (8 * 1.25));
  EXPECT_DOUBLE_EQ(clock.now_s(), 50 + 8 * 1.25) << "nothing else read the clock's time";
}

TEST(Trainer, EvalEveryEvaluatesBetweenEpochEndsToo) {
  testing::FakeClock clock;
  const TargetRun run = train_toward(std::nullopt, clock);
  // Every 3 steps and at the epoch ends (16, 32, 48), each step once.
  const std::vector<int64_t> expected{3,  6,  9,  12, 15, 16, 18, 21, 24, 27, 30,
                                      32, 33, 36, 39, 42, 45, 48};
  EXPECT_EQ(run.eval_steps, expected);
  EXPECT_EQ(run.summary.steps, 48);
  EXPECT_DOUBLE_EQ(run.summary.seconds, 48.0) << "evaluation time is not training time";
  EXPECT_FALSE(run.summary.target.has_value());
  EXPECT_FALSE(run.summary.steps_to_target.has_value());
}

TEST(Trainer, StopsAtTheFirstEvaluationThatReachesTheTargetAccuracy) {
  testing::FakeClock reference_clock;
  const TargetRun reference = train_toward(std::nullopt, reference_clock);
  // The target: the best accuracy of the first half of the evaluations, so
  // that the run reaches it before its end; it must stop at the first
  // evaluation at or above it.
  const size_t half = reference.accuracies.size() / 2;
  const double target =
      *std::max_element(reference.accuracies.begin(), reference.accuracies.begin() + half);
  ASSERT_GT(target, 0.25) << "the toy problem learns beyond chance";
  size_t first = 0;
  while (reference.accuracies[first] < target) ++first;
  const int64_t expected_step = reference.eval_steps[first];
  ASSERT_LT(expected_step, 48);

  testing::FakeClock clock;
  const TargetRun run = train_toward(target, clock);
  EXPECT_EQ(run.summary.steps, expected_step);
  EXPECT_EQ(run.eval_steps.back(), expected_step) << "no evaluation after the target";
  EXPECT_EQ(run.targets_reached, 1);
  EXPECT_TRUE(run.summary.complete);
  ASSERT_TRUE(run.summary.target.has_value());
  EXPECT_EQ(run.summary.target->metric, "test_accuracy");
  EXPECT_DOUBLE_EQ(run.summary.target->value, target);
  EXPECT_TRUE(run.summary.target_reached);
  ASSERT_TRUE(run.summary.test_accuracy.has_value());
  EXPECT_GE(*run.summary.test_accuracy, target);
  EXPECT_EQ(run.summary.steps_to_target, expected_step);
  EXPECT_EQ(run.summary.samples_to_target, expected_step * 32);
  // 1 s per step; the evaluations' 100 s each are left out.
  EXPECT_EQ(run.summary.seconds_to_target, static_cast<double>(expected_step));
  EXPECT_DOUBLE_EQ(run.summary.seconds, static_cast<double>(expected_step));
}

TEST(Trainer, ATargetNotReachedLeavesTheToTargetFieldsEmpty) {
  testing::FakeClock clock;
  const TargetRun run = train_toward(1.0, clock);  // 100 % on held-out data: not here
  ASSERT_LT(*run.summary.test_accuracy, 1.0);
  EXPECT_EQ(run.summary.steps, 48);
  EXPECT_TRUE(run.summary.complete);
  ASSERT_TRUE(run.summary.target.has_value());
  EXPECT_FALSE(run.summary.target_reached);
  EXPECT_FALSE(run.summary.steps_to_target.has_value());
  EXPECT_FALSE(run.summary.seconds_to_target.has_value());
  EXPECT_FALSE(run.summary.samples_to_target.has_value());
  EXPECT_EQ(run.targets_reached, 0);
}

TEST(Trainer, BadTargetOptionsAreRefusedNamingTheFlag) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto data = toy_data({16}, 64, 4, 6);
  const Plan plan = make_plan(PlanOptions().micro_batch_size(8));
  const auto refused = [&](const TrainOptions& options, const Dataset* test) {
    Workload w = make_workload("mlp", {16}, 4);
    try {
      Trainer(w, *memory, plan, *data, test, options);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  for (double bad : {0.0, -0.5, 1.5, 85.0, std::nan("")}) {
    EXPECT_NE(refused(TrainOptions().target_accuracy(bad), data.get()).find("--target-accuracy"),
              std::string::npos)
        << bad;
  }
  EXPECT_NE(refused(TrainOptions().target_accuracy(0.85), nullptr).find("test split"),
            std::string::npos);
  EXPECT_NE(refused(TrainOptions().eval_every(-1), data.get()).find("--eval-every"),
            std::string::npos);
  EXPECT_EQ(refused(TrainOptions().target_accuracy(1.0).eval_every(2), data.get()), "accepted");
}

TEST(Trainer, ATargetAccuracyGivenAsAPercentIsToldItsFractionAndOnlyThen) {
  const auto message = [](double a) { return testing::error_of([&] { check_target_accuracy(a); }); };
  EXPECT_EQ(message(0.85), "");
  EXPECT_EQ(message(1.0), "");
  EXPECT_NE(message(85).find("got 85 (for 85 % give 0.85)"), std::string::npos) << message(85);
  // Just above 1 is a slip, not 1.0000001 %: it said "give 0.010000001000000001".
  EXPECT_EQ(message(1.0000001),
            "--target-accuracy: must be a fraction in (0, 1], like 0.85; got 1.0000001");
  EXPECT_EQ(message(1.5).find("give"), std::string::npos) << message(1.5);
}

TEST(TrainReporter, TheSummaryJsonHasTheTargetFields) {
  TrainSummary none;
  const nlohmann::json plain = to_json(none);
  for (const char* key : {"target", "steps_to_target", "seconds_to_target", "samples_to_target"}) {
    ASSERT_TRUE(plain.contains(key)) << key;
    EXPECT_TRUE(plain[key].is_null()) << key << " without a target";
  }
  TrainSummary reached;
  reached.target = TrainTarget{"test_accuracy", 0.85};
  reached.target_reached = true;
  reached.steps_to_target = 420;
  reached.seconds_to_target = 12.5;
  reached.samples_to_target = 420 * 64;
  const nlohmann::json j = to_json(reached);
  EXPECT_EQ(j["target"]["metric"], "test_accuracy");
  EXPECT_DOUBLE_EQ(j["target"]["value"].get<double>(), 0.85);
  EXPECT_EQ(j["target"]["reached"], true);
  EXPECT_EQ(j["steps_to_target"], 420);
  EXPECT_DOUBLE_EQ(j["seconds_to_target"].get<double>(), 12.5);
  EXPECT_EQ(j["samples_to_target"], 420 * 64);

  std::ostringstream console;
  TrainConsoleReporter(console, false).summary(reached);
  EXPECT_NE(console.str().find("target test accuracy 85.00 %: reached at step 420"),
            std::string::npos)
      << console.str();
}

TEST(TrainConsoleReporter, AStepOfFewerSamplesThanItsMicroBatchesIsNoFalseProduct) {
  // Fixed text batches of 4 over a one-paragraph folder printed "micro-batch 4 x 1 = 1".
  TrainSummary s;
  s.steps = 3;
  s.samples = 3;
  s.micro_batch_size = 4;
  s.accumulation_steps = 1;
  s.global_batch_size = 1;
  std::ostringstream console;
  TrainConsoleReporter(console, false).summary(s);
  EXPECT_EQ(console.str().find("4 x 1 = 1"), std::string::npos) << console.str();
  EXPECT_NE(console.str().find("micro-batches of up to 4 x 1, 1.0 samples a step on average"),
            std::string::npos)
      << console.str();
  s.global_batch_size = 4;
  s.samples = 12;
  std::ostringstream whole;
  TrainConsoleReporter(whole, false).summary(s);
  EXPECT_NE(whole.str().find("micro-batch 4 x 1 = 4"), std::string::npos) << whole.str();
}

TEST(Trainer, ResumingARunThatReachedItsTargetReemitsItsSummary) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto train = toy_data({16}, 512, 4, 2);
  const auto test = toy_data({16}, 128, 4, 12);
  const Plan plan = make_plan(PlanOptions().micro_batch_size(32).base_lr(1e-2));
  const std::string dir = ::testing::TempDir() + "batchtune_target_resume";
  std::remove((dir + "/" + kCheckpointFile).c_str());
  ::mkdir(dir.c_str(), 0755);
  // Any accuracy above chance: reached within the run.
  const auto options = TrainOptions().epochs(3).eval_every(2).target_accuracy(0.3).checkpoint_dir(dir);
  Workload w = make_workload("mlp", {16}, 4);
  const TrainSummary first = Trainer(w, *memory, plan, *train, test.get(), options).run();
  ASSERT_TRUE(first.target_reached);
  ASSERT_LT(first.steps, 48);
  Workload again = make_workload("mlp", {16}, 4);
  const TrainSummary second =
      Trainer(again, *memory, plan, *train, test.get(), TrainOptions(options).resume(true)).run();
  EXPECT_TRUE(second.already_finished);
  EXPECT_EQ(second.steps, first.steps);
  EXPECT_EQ(second.steps_to_target, first.steps_to_target);
  EXPECT_EQ(second.samples_to_target, first.samples_to_target);
  EXPECT_EQ(second.seconds_to_target, first.seconds_to_target);
}

}  // namespace
}  // namespace batchtune
