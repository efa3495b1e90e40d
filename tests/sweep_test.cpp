#include "batchtune/tuning/sweep.h"
#include "batchtune/step/trial_failure.h"

#include <gtest/gtest.h>

#include "batchtune/common/error.h"

namespace {

using namespace batchtune;

std::vector<SweepRow> rows(const std::vector<std::pair<int64_t, double>>& curve, double busy = 1) {
  std::vector<SweepRow> out;
  for (const auto& [b, sps] : curve) {
    SweepRow r;
    r.batch_size = b;
    r.samples_per_s = sps;
    r.busy = busy;
    out.push_back(r);
  }
  return out;
}

TEST(Sweep, GridIsPowersOfTwoAndTheMaximum) {
  EXPECT_EQ(sweep_grid(100), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 100}));
  EXPECT_EQ(sweep_grid(64), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64}));
  EXPECT_EQ(sweep_grid(1), (std::vector<int64_t>{1}));
}

TEST(Sweep, ThroughputPicksTheSmallestWithinTolerance) {
  const auto r = rows({{16, 500}, {32, 900}, {64, 990}, {128, 1000}, {200, 1005}});
  const Selection s = select_batch(r, Objective::kThroughput, 0.02);
  EXPECT_EQ(s.batch_size, 64);  // 990 >= 1005 * 0.98 = 984.9
  EXPECT_NE(s.reason.find("98.5 %"), std::string::npos) << s.reason;
  EXPECT_EQ(select_batch(r, Objective::kThroughput, 0.11).batch_size, 32);
  EXPECT_EQ(select_batch(r, Objective::kThroughput, 0.0).batch_size, 200);
}

TEST(Sweep, MaxFitPicksTheLargest) {
  const auto r = rows({{16, 500}, {32, 900}, {64, 400}});
  EXPECT_EQ(select_batch(r, Objective::kMaxFit).batch_size, 64);
}

TEST(Sweep, Diagnoses) {
  const auto rising = rows({{32, 500}, {64, 800}, {128, 1200}});
  EXPECT_EQ(diagnose(rising, select_batch(rising, Objective::kThroughput)).kind,
            "small-batch-bound");
  const auto flat = rows({{32, 900}, {64, 1000}, {128, 1001}});
  EXPECT_EQ(diagnose(flat, select_batch(flat, Objective::kThroughput)).kind, "compute-bound");
  const auto waiting = rows({{32, 900}, {64, 1000}}, 0.8);
  const Diagnosis d = diagnose(waiting, select_batch(waiting, Objective::kThroughput));
  EXPECT_EQ(d.kind, "input-bound");
  EXPECT_NE(d.text.find("20 %"), std::string::npos) << d.text;
  const auto tiny = rows({{1, 10}, {2, 15}, {4, 19}});
  EXPECT_EQ(diagnose(tiny, select_batch(tiny, Objective::kThroughput)).kind, "memory-bound");
}

TEST(Sweep, RetimesNoisyTrialsAndSkipsFailures) {
  std::vector<int64_t> asked;
  const auto trial = [&](const TrialOptions& o) {
    asked.push_back(o.batch_size());
    TrialResult t;
    t.batch_size = o.batch_size();
    t.fits = o.batch_size() <= 8;
    t.steps_run = o.steps() + o.warmup_steps();
    // Noisy with few steps, steady with many.
    t.step_ms_spread = o.steps() >= 10 ? 0.01 : 0.30;
    t.step_ms = 10;
    t.samples_per_s = o.batch_size() * 100.0;
    return t;
  };
  const auto r = run_sweep(trial, {4, 8, 16});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].batch_size, 4);
  EXPECT_DOUBLE_EQ(r[0].samples_per_s_spread, 0.01);
  EXPECT_EQ(r[0].steps, kSweepTimedSteps + kSweepWarmupSteps + kSweepMaxSteps);
  EXPECT_EQ(asked, (std::vector<int64_t>{4, 4, 8, 8, 16}));
}

TEST(Sweep, ReusesSearchTrialsTimedWellEnough) {
  TrialResult searched;
  searched.batch_size = 8;
  searched.fits = true;
  searched.step_seconds = std::vector<double>(kSweepTimedSteps, 0.01);
  searched.step_ms_spread = 0;
  searched.samples_per_s = 800;
  int calls = 0;
  const auto trial = [&](const TrialOptions& o) {
    ++calls;
    TrialResult t;
    t.batch_size = o.batch_size();
    t.fits = true;
    t.samples_per_s = 1;
    return t;
  };
  const auto r = run_sweep(trial, {4, 8}, {searched});
  EXPECT_EQ(calls, 1);
  EXPECT_DOUBLE_EQ(r[1].samples_per_s, 800);
}

TEST(Sweep, BadObjectiveOrToleranceIsAUserError) {
  EXPECT_THROW(parse_objective("fastest"), Error);
  EXPECT_THROW(select_batch(rows({{1, 1}}), Objective::kThroughput, 1.5), Error);
}

}  // namespace

namespace {

TEST(Sweep, GrowsTheStepsOfFastTrialsLikeGoogleBenchmark) {
  using namespace batchtune;
  TrialResult fast;
  fast.step_seconds = std::vector<double>(5, 0.001);  // 5 ms in all
  EXPECT_EQ(steps_needed(fast), 1400);                  // 5 * 1.0 / 0.005 * 1.4
  fast.step_seconds = std::vector<double>(5, 0.00001);
  EXPECT_EQ(steps_needed(fast), kSweepMaxAutoSteps);
  TrialResult slow;
  slow.step_seconds = std::vector<double>(5, 0.25);
  EXPECT_EQ(steps_needed(slow), 5);
  EXPECT_EQ(steps_needed(TrialResult{}), 0);
}

TEST(Trial, RecognisesSizesThatDoNotRun) {
  using namespace batchtune;
  EXPECT_TRUE(is_size_refusal(
      "Expected more than 1 value per channel when training, got input size [1, 512, 1, 1]"));
  EXPECT_TRUE(is_size_refusal("CUDA error: invalid configuration argument"));
  EXPECT_FALSE(is_size_refusal("mat1 and mat2 shapes cannot be multiplied (4x10 and 12x3)"));
}

}  // namespace
