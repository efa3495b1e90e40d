#include "batchtune/training/trainer.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <csignal>
#include <cstdio>
#include <string>

#include "batchtune/memory/budget_allocator.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/step/workload.h"
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

}  // namespace
}  // namespace batchtune
