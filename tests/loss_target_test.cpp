// `--target-loss`: the moving mean that stops a run (`LossTarget`), and the
// image trainer stopping at it, resumed or not. The text run's own stop is in
// text_test.cpp.
#include "batchtune/training/loss_target.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include "batchtune/common/error.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/workload.h"
#include "batchtune/training/checkpoint.h"
#include "batchtune/training/trainer.h"
#include "fake_clock.h"
#include "test_helpers.h"

namespace batchtune {
namespace {

TEST(LossTarget, IsReachedOnceAFullWindowsMeanIsAtOrBelowTheTarget) {
  LossTarget target(2.0, 3);
  EXPECT_FALSE(target.add(1.0)) << "one lucky step is no window";
  EXPECT_FALSE(target.add(1.0));
  EXPECT_TRUE(target.add(4.0)) << "(1 + 1 + 4) / 3 = 2, at the target";
  EXPECT_DOUBLE_EQ(target.mean(), 2.0);
  EXPECT_FALSE(target.add(4.0)) << "(1 + 4 + 4) / 3 = 3: the oldest left the window";
  EXPECT_EQ(target.window(), (std::vector<double>{1.0, 4.0, 4.0}));
  EXPECT_NE(target.reached_message(12, 3.5).find("over the last 3 steps"), std::string::npos)
      << target.reached_message(12, 3.5);
}

TEST(LossTarget, ASmallTargetIsPrintedAsItWasGivenNotAsZero) {
  // --target-loss 1e-6 printed "the target 0.0000".
  EXPECT_EQ(format_loss(1e-6), "1e-06");
  EXPECT_EQ(format_loss(1.5), "1.5000");
  EXPECT_EQ(format_loss(0), "0.0000");
  LossTarget target(1e-6, 1);
  EXPECT_TRUE(target.add(5e-7));
  const std::string message = target.reached_message(3, 1.0);
  EXPECT_NE(message.find("mean loss 5e-07 over the last 1 steps reached the target 1e-06"),
            std::string::npos)
      << message;
}

TEST(LossTarget, ARestoredWindowDecidesAsTheWholeRunWould) {
  const std::vector<double> losses{3.1, 2.7, 2.2, 1.9, 2.4, 1.7, 1.6, 1.8};
  LossTarget whole(2.0, 4);
  std::vector<bool> whole_decisions;
  for (double loss : losses) whole_decisions.push_back(whole.add(loss));
  for (size_t stop = 0; stop <= losses.size(); ++stop) {
    LossTarget before(2.0, 4);
    for (size_t i = 0; i < stop; ++i) before.add(losses[i]);
    LossTarget resumed(2.0, 4);
    resumed.restore(before.window());
    for (size_t i = stop; i < losses.size(); ++i) {
      EXPECT_EQ(resumed.add(losses[i]), whole_decisions[i]) << "stopped at " << stop << ", step " << i;
    }
  }
}

constexpr int64_t kMemoryLimit = int64_t{1} << 30;

/// An mlp on toy data, one step a second on a fake clock: the losses of each
/// optimizer step (log events every step), and where a target stopped it.
struct ImageRun {
  std::vector<double> losses;
  int64_t targets_reached = 0;
  std::string reached_message;
  TrainSummary summary;
};

ImageRun train_images(TrainOptions options) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto train = testing::toy_data({16}, 512, 4, 2);
  Workload w(WorkloadOptions().model("mlp").input_shape({16}).classes(4).seed(7));
  const Plan plan = make_plan(PlanOptions().micro_batch_size(32).base_lr(1e-2));
  testing::FakeClock clock;
  // A window of 4 steps unless the test gives its own.
  if (options.loss_window() == TrainOptions().loss_window()) options.loss_window(4);
  Trainer trainer(w, *memory, plan, *train, nullptr,
                  options.seed(3).log_every(1).clock(&clock));
  trainer.set_before_step([&](int64_t) { clock.advance(1); });
  ImageRun run;
  trainer.set_callback([&](const TrainEvent& e) {
    if (e.kind == TrainEvent::Kind::kLog) run.losses.push_back(e.loss);
    if (e.kind == TrainEvent::Kind::kTargetReached) {
      ++run.targets_reached;
      run.reached_message = e.message;
    }
  });
  run.summary = trainer.run();
  return run;
}

/// The step (from 1) at which the mean of the last 4 of `losses` first is at
/// or below `target`; 0 when never.
int64_t first_reaching(const std::vector<double>& losses, double target) {
  LossTarget window(target, 4);
  for (size_t i = 0; i < losses.size(); ++i) {
    if (window.add(losses[i])) return static_cast<int64_t>(i) + 1;
  }
  return 0;
}

TEST(TrainerTargetLoss, StopsAnImageRunAtTheStepWhoseMovingMeanReachesIt) {
  const ImageRun reference = train_images(TrainOptions().epochs(3));
  ASSERT_EQ(reference.losses.size(), 48u);  // 16 steps an epoch
  // The mean a third of the way in: reached well before the end.
  LossTarget probe(1e9, 4);
  for (size_t i = 0; i < 16; ++i) probe.add(reference.losses[i]);
  const double target = probe.mean();
  const int64_t expected = first_reaching(reference.losses, target);
  ASSERT_GT(expected, 3);
  ASSERT_LE(expected, 16);

  const ImageRun run = train_images(TrainOptions().epochs(3).target_loss(target));
  EXPECT_EQ(run.summary.steps, expected);
  EXPECT_TRUE(run.summary.complete);
  EXPECT_EQ(run.targets_reached, 1);
  EXPECT_NE(run.reached_message.find("reached the target"), std::string::npos)
      << run.reached_message;
  ASSERT_TRUE(run.summary.target.has_value());
  EXPECT_EQ(run.summary.target->metric, "train_loss");
  EXPECT_DOUBLE_EQ(run.summary.target->value, target);
  EXPECT_TRUE(run.summary.target_reached);
  EXPECT_EQ(run.summary.steps_to_target, expected);
  EXPECT_EQ(run.summary.samples_to_target, expected * 32);
  EXPECT_EQ(run.summary.seconds_to_target, static_cast<double>(expected)) << "1 s a step";
  for (size_t i = 0; i < run.losses.size(); ++i) {
    EXPECT_EQ(run.losses[i], reference.losses[i]) << "the same steps, step " << i + 1;
  }
}

TEST(TrainerTargetLoss, ATargetNotReachedTrainsTheRunOut) {
  const ImageRun run = train_images(TrainOptions().epochs(1).target_loss(1e-9));
  EXPECT_EQ(run.summary.steps, 16);
  EXPECT_EQ(run.targets_reached, 0);
  ASSERT_TRUE(run.summary.target.has_value());
  EXPECT_FALSE(run.summary.target_reached);
  EXPECT_FALSE(run.summary.steps_to_target.has_value());
}

TEST(TrainerTargetLoss, AResumedRunStopsAtTheSameStepAsTheWholeRun) {
  const ImageRun reference = train_images(TrainOptions().epochs(3));
  LossTarget probe(1e9, 4);
  for (size_t i = 0; i < 20; ++i) probe.add(reference.losses[i]);
  const double target = probe.mean();
  const int64_t expected = first_reaching(reference.losses, target);
  ASSERT_GT(expected, 6);

  const std::string dir = ::testing::TempDir() + "batchtune_target_loss_resume";
  std::remove((dir + "/" + kCheckpointFile).c_str());
  ::mkdir(dir.c_str(), 0755);
  // Stopped 2 steps before the target, mid-window: the window's losses
  // before the stop count after the resume.
  const ImageRun first = train_images(
      TrainOptions().steps(expected - 2).target_loss(target).checkpoint_dir(dir));
  EXPECT_FALSE(first.summary.target_reached);
  const ImageRun resumed = train_images(
      TrainOptions().epochs(3).target_loss(target).checkpoint_dir(dir).resume(true));
  EXPECT_EQ(resumed.summary.resumed_from_step, expected - 2);
  EXPECT_TRUE(resumed.summary.target_reached);
  EXPECT_EQ(resumed.summary.steps, expected);
  std::remove((dir + "/" + kCheckpointFile).c_str());
}

TEST(TrainerTargetLoss, BadTargetsAreRefusedNamingTheFlag) {
  const auto refused = [](const TrainOptions& options) -> std::string {
    try {
      train_images(options);
    } catch (const OptionError& e) {
      return std::string(e.what());
    }
    return "accepted";
  };
  for (double bad : {0.0, -1.0, std::nan("")}) {
    EXPECT_EQ(refused(TrainOptions().steps(1).target_loss(bad)).rfind("--target-loss:", 0), 0u)
        << bad;
  }
  EXPECT_NE(refused(TrainOptions().steps(1).target_loss(1.0).target_accuracy(0.9))
                .find("not both"),
            std::string::npos);
  const std::string no_window = refused(TrainOptions().steps(1).target_loss(1.0).loss_window(0));
  EXPECT_EQ(no_window.rfind("--target-loss:", 0), 0u) << no_window;
}

}  // namespace
}  // namespace batchtune
