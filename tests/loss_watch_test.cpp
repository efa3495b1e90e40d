// A loss that says the lr is wrong (`LossWatch`): not finite, or flat from
// the start; and the image trainer saying so once, in its events and its
// summary. The text run's and `--adapt`'s are in text_test.cpp and
// trainer_adapt_test.cpp.
#include "batchtune/training/loss_watch.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "batchtune/memory/device_memory.h"
#include "batchtune/step/workload.h"
#include "batchtune/training/train_summary_json.h"
#include "batchtune/training/trainer.h"
#include "test_helpers.h"

namespace batchtune {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kLn10 = 2.302585;

/// The plan: sgd at 0.1 for batch 256, scaled linearly to 512 with
/// 20 warm-up steps.
Plan scaled_plan() {
  Plan plan;
  plan.global_batch_size = 512;
  plan.lr = 0.2;
  plan.lr_scaling = LrScaling::kLinear;
  plan.warmup_steps = 20;
  plan.workload.base_lr = 0.1;
  plan.workload.base_batch = 256;
  return plan;
}

/// Feeds `watch` chunks of ten steps of `loss` from step `from` (done) to
/// `to`; the divergences it said, in order.
std::vector<Divergence> feed(LossWatch& watch, int64_t from, int64_t to, double loss) {
  std::vector<Divergence> said;
  for (int64_t step = from + 10; step <= to; step += 10) {
    if (auto d = watch.observe(step, loss * 10, 10)) said.push_back(*d);
  }
  return said;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(LossWatch, ANonFiniteLossIsSaidOnceNamingTheLrItsScalingAndTheWarmUp) {
  LossWatch watch(scaled_plan(), /*adapting=*/true, /*from_start=*/true);
  EXPECT_TRUE(feed(watch, 0, 10, kLn10).empty());
  EXPECT_TRUE(watch.finite());
  const auto d = watch.observe(20, kNaN, 10);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->kind, Divergence::Kind::kNotFinite);
  EXPECT_EQ(d->step, 20);
  EXPECT_TRUE(contains(d->note, "not finite (nan) by step 20")) << d->note;
  EXPECT_TRUE(contains(d->note, "lr 0.2 (--base-lr 0.1 at batch 256 scaled linear to batch 512) "
                                "after 20 warm-up steps"))
      << d->note;
  EXPECT_TRUE(contains(d->note, "lower --lr")) << d->note;
  EXPECT_TRUE(contains(d->note, "--adapt decides no more changes of the batch")) << d->note;
  EXPECT_EQ(d->note.find('\n'), std::string::npos) << "one line";
  EXPECT_FALSE(watch.finite());
  // Said once; an infinite loss later, or a flat one, says nothing more.
  EXPECT_FALSE(watch.observe(30, std::numeric_limits<double>::infinity(), 10).has_value());
  EXPECT_TRUE(feed(watch, 30, 200, kLn10).empty());
  ASSERT_TRUE(watch.divergence().has_value());
  EXPECT_EQ(watch.divergence()->step, 20);
}

TEST(LossWatch, AFlatLossIsSaidAtTheEndOfItsWindowAndOnlyThen) {
  LossWatch watch(scaled_plan(), /*adapting=*/false, /*from_start=*/true);
  ASSERT_EQ(watch.flat_window_steps(), kFlatWindowSteps);
  EXPECT_TRUE(feed(watch, 0, kFlatWindowSteps - 10, kLn10).empty());
  EXPECT_FALSE(watch.divergence().has_value());
  // 0.5 % below the start is still flat.
  const auto d = watch.observe(kFlatWindowSteps, kLn10 * 0.995 * 10, 10);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->kind, Divergence::Kind::kFlat);
  EXPECT_EQ(d->step, kFlatWindowSteps);
  EXPECT_TRUE(contains(d->note, "has not fallen in 100 steps")) << d->note;
  EXPECT_TRUE(contains(d->note, "lr 0.2 (--base-lr 0.1 at batch 256 scaled linear")) << d->note;
  EXPECT_TRUE(contains(d->note, "too high")) << d->note;
  EXPECT_FALSE(contains(d->note, "--adapt")) << d->note;
  EXPECT_TRUE(watch.finite()) << "a flat loss is finite: --adapt goes on deciding";
  EXPECT_TRUE(feed(watch, kFlatWindowSteps, 300, kLn10).empty()) << "said once";
  // A loss not finite after a flat start replaces it.
  const auto later = watch.observe(310, kNaN, 10);
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(watch.divergence()->kind, Divergence::Kind::kNotFinite);
}

TEST(LossWatch, ALossThatFallsIsNotFlatAndALaterPlateauIsNoFault) {
  LossWatch watch(scaled_plan(), false, true);
  EXPECT_TRUE(feed(watch, 0, 50, 2.30).empty());
  EXPECT_TRUE(feed(watch, 50, 100, 2.25).empty()) << "2.2 % below the start";
  EXPECT_TRUE(feed(watch, 100, 1000, 2.25).empty()) << "judged once, at the window's end";
  EXPECT_FALSE(watch.divergence().has_value());
}

TEST(LossWatch, ALongWarmUpWidensTheWindowAndAResumeJudgesFinitenessOnly) {
  Plan plan = scaled_plan();
  plan.warmup_steps = 80;
  LossWatch warm(plan, false, true);
  EXPECT_EQ(warm.flat_window_steps(), 160) << "half the window at the full lr";
  EXPECT_TRUE(feed(warm, 0, 150, kLn10).empty());
  EXPECT_EQ(feed(warm, 150, 160, kLn10).size(), 1u);

  LossWatch resumed(scaled_plan(), false, /*from_start=*/false);
  EXPECT_TRUE(feed(resumed, 500, 1000, kLn10).empty()) << "a plateau mid-way is no fault";
  EXPECT_TRUE(resumed.observe(1010, kNaN, 10).has_value());
}

TEST(LossWatch, AZeroLrIsNamedAsTheCauseOfAFlatLoss) {
  Plan plan = scaled_plan();
  plan.lr = 0;
  LossWatch watch(plan, false, true);
  const auto said = feed(watch, 0, 100, kLn10);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_TRUE(contains(said[0].note, "0, which trains nothing; give a positive --lr"))
      << said[0].note;
}

// The trainer: a toy problem that learns, a lr that blows up, and a zero lr.

constexpr int64_t kMemoryLimit = int64_t{1} << 30;

struct WatchedRun {
  std::vector<TrainEvent> divergences;
  TrainSummary summary;
};

/// `steps` steps of an mlp on one batch of 16 samples, the same every step
/// (a loss that does not move at lr 0 is then the same to the last bit).
WatchedRun train_mlp(const std::string& optimizer, double lr, int64_t steps) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto data = testing::toy_data({16}, 16, 4, 2);
  Workload w(
      WorkloadOptions().model("mlp").input_shape({16}).classes(4).optimizer(optimizer).seed(7));
  Plan plan = make_plan(PlanOptions().micro_batch_size(16).base_lr(1e-2).base_batch(16));
  plan.lr = lr;
  Trainer trainer(w, *memory, plan, *data, nullptr, TrainOptions().steps(steps).seed(1));
  WatchedRun run;
  trainer.set_callback([&](const TrainEvent& e) {
    if (e.kind == TrainEvent::Kind::kDivergence) run.divergences.push_back(e);
  });
  run.summary = trainer.run();
  return run;
}

TEST(LossWatch, ATrainingRunSaysALossThatIsNotFiniteOnceAndItsSummaryCarriesIt) {
  const WatchedRun run = train_mlp("sgd", 1e6, 40);
  ASSERT_EQ(run.divergences.size(), 1u) << "said once";
  EXPECT_TRUE(contains(run.divergences[0].message, "the loss is not finite"))
      << run.divergences[0].message;
  EXPECT_TRUE(contains(run.divergences[0].message, "lr 1e+06")) << run.divergences[0].message;
  ASSERT_TRUE(run.summary.divergence.has_value());
  EXPECT_EQ(run.summary.divergence->kind, Divergence::Kind::kNotFinite);
  EXPECT_EQ(run.summary.divergence->step, run.divergences[0].step);
  EXPECT_EQ(run.summary.steps, 40) << "it keeps training, and says so";
  const nlohmann::json j = to_json(run.summary);
  EXPECT_EQ(j.at("divergence").at("kind"), "not_finite");
  EXPECT_EQ(j.at("divergence").at("step"), run.summary.divergence->step);
  EXPECT_EQ(j.at("divergence").at("note"), run.divergences[0].message);
  // A checkpoint's stored summary reads it back.
  const TrainSummary back = summary_from_json(j);
  ASSERT_TRUE(back.divergence.has_value());
  EXPECT_EQ(back.divergence->note, run.summary.divergence->note);
}

TEST(LossWatch, ATrainingRunAtLrZeroSaysItsLossIsFlatAtTheWindowsEnd) {
  const WatchedRun run = train_mlp("adam", 0, kFlatWindowSteps + 20);
  ASSERT_EQ(run.divergences.size(), 1u);
  EXPECT_EQ(run.divergences[0].step, kFlatWindowSteps);
  EXPECT_TRUE(contains(run.divergences[0].message, "has not fallen")) << run.divergences[0].message;
  ASSERT_TRUE(run.summary.divergence.has_value());
  EXPECT_EQ(to_json(run.summary).at("divergence").at("kind"), "flat");
}

TEST(LossWatch, AConvergingRunSaysNothing) {
  const WatchedRun run = train_mlp("adam", 1e-2, 2 * kFlatWindowSteps);
  EXPECT_TRUE(run.divergences.empty()) << run.divergences.front().message;
  EXPECT_FALSE(run.summary.divergence.has_value());
  EXPECT_TRUE(to_json(run.summary).at("divergence").is_null());
}

}  // namespace
}  // namespace batchtune
