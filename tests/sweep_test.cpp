#include "batchtune/tuning/sweep.h"
#include "batchtune/step/trial_failure.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "batchtune/common/error.h"
#include "fake_clock.h"

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
  EXPECT_EQ(sweep_order(100), (std::vector<int64_t>{100, 1, 2, 4, 8, 16, 32, 64}));
  // A target of 32: its largest divisors below the largest batch 5 come
  // next (4, 2, 1), so a plan reaching 32 exactly knows what 4 costs.
  EXPECT_EQ(sweep_order(5, 32), (std::vector<int64_t>{5, 4, 2, 1}));
  EXPECT_EQ(sweep_order(100, 96), (std::vector<int64_t>{100, 96, 48, 32, 1, 2, 4, 8, 16, 64}));
  EXPECT_EQ(sweep_order(1, 32), (std::vector<int64_t>{1}));
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
  const auto waiting = rows({{16, 600}, {32, 900}, {64, 1000}}, 0.8);
  const Diagnosis d = diagnose(waiting, select_batch(waiting, Objective::kThroughput));
  EXPECT_EQ(d.kind, "input-bound");
  EXPECT_NE(d.text.find("20 %"), std::string::npos) << d.text;
  const auto tiny = rows({{1, 10}, {2, 15}, {4, 19}});
  EXPECT_EQ(diagnose(tiny, select_batch(tiny, Objective::kThroughput)).kind, "memory-bound");
}

/// A row measured as `n` readings spread ±`half` around `sps` samples/s.
SweepRow measured(int64_t batch, double sps, double half, int n = 20) {
  std::vector<double> readings;
  for (int i = 0; i < n; ++i) readings.push_back(sps * (1 - half + 2 * half * i / (n - 1)));
  SweepRow r;
  r.batch_size = batch;
  r.samples_per_s_ci = estimate_median(readings);
  r.samples_per_s = r.samples_per_s_ci.median;
  r.noisy = r.samples_per_s_ci.noisy();
  r.busy = 1;
  return r;
}

TEST(Sweep, AChoiceTheIntervalsSettleStatesItsConfidence) {
  // Narrow intervals, far apart: conclusive.
  const std::vector<SweepRow> clear = {measured(16, 500, 0.01), measured(32, 900, 0.01),
                                       measured(64, 1000, 0.01)};
  const Selection s = select_batch(clear, Objective::kThroughput, 0.02);
  EXPECT_EQ(s.batch_size, 64);
  ASSERT_TRUE(s.confidence.has_value());
  EXPECT_GE(*s.confidence, kConfidenceLevel);
  EXPECT_TRUE(s.contenders.empty());
  EXPECT_NE(s.reason.find("confidence"), std::string::npos) << s.reason;
}

TEST(Sweep, OverlappingIntervalsLeaveTheChoiceInconclusive) {
  // 32 is 3 % slower by its median, but its ±10 % interval reaches the band.
  const std::vector<SweepRow> close = {measured(16, 500, 0.01), measured(32, 970, 0.10),
                                       measured(64, 1000, 0.01)};
  const Selection s = select_batch(close, Objective::kThroughput, 0.02);
  EXPECT_EQ(s.batch_size, 64) << "the medians still choose";
  EXPECT_FALSE(s.confidence.has_value());
  EXPECT_EQ(s.contenders, (std::vector<int64_t>{32}));
  EXPECT_NE(s.reason.find("inconclusive"), std::string::npos) << s.reason;
  EXPECT_EQ(s.reason.find("no smaller batch comes within"), std::string::npos) << s.reason;
}

TEST(Sweep, RowsOfOneTimedStepLeaveTheChoiceInconclusiveNotAtZeroPercent) {
  std::vector<SweepRow> single = {measured(16, 500, 0.01), measured(32, 900, 0.01)};
  SweepRow one;
  one.batch_size = 64;
  one.samples_per_s_ci = estimate_median({1000});  // one step: an interval of no level
  one.samples_per_s = 1000;
  one.busy = 1;
  single.push_back(one);
  ASSERT_EQ(one.samples_per_s_ci.level, 0);
  const Selection s = select_batch(single, Objective::kThroughput, 0.02);
  EXPECT_EQ(s.batch_size, 64);
  EXPECT_FALSE(s.confidence.has_value());
  EXPECT_NE(s.reason.find("inconclusive"), std::string::npos) << s.reason;
  EXPECT_EQ(s.reason.find("0 % confidence"), std::string::npos) << s.reason;
}

TEST(Sweep, GoodputAndEnergyChoicesAreAsSureAsTheRowsTheyRead) {
  std::vector<SweepRow> steady = {measured(8, 100, 0.01), measured(16, 300, 0.02)};
  ASSERT_TRUE(rows_confidence(steady).has_value());
  EXPECT_GE(*rows_confidence(steady), kConfidenceLevel);
  steady.push_back(measured(32, 400, 0.5));
  EXPECT_FALSE(rows_confidence(steady).has_value()) << "a noisy row: inconclusive";
}

TEST(Sweep, NoDiagnosisOfSpeedFromFewOrNoisyRows) {
  const auto two = rows({{32, 500}, {64, 800}});
  EXPECT_EQ(diagnose(two, select_batch(two, Objective::kThroughput)).kind, "inconclusive");
  std::vector<SweepRow> noisy = {measured(8, 100, 0.01), measured(16, 300, 0.5),
                                 measured(32, 400, 0.01), measured(64, 900, 0.01)};
  const Diagnosis d = diagnose(noisy, select_batch(noisy, Objective::kThroughput));
  EXPECT_EQ(d.kind, "small-batch-bound") << "one noisy row among four steady ones: "
                                         << d.text;
  noisy[3] = measured(64, 900, 0.5);  // the largest row itself is noisy
  const Diagnosis unsure = diagnose(noisy, select_batch(noisy, Objective::kThroughput));
  EXPECT_EQ(unsure.kind, "inconclusive");
  EXPECT_NE(unsure.text.find("16, 64"), std::string::npos) << unsure.text;
  // Memory is read from the search, not from speed: said with one row too.
  EXPECT_EQ(diagnose(rows({{2, 10}}), select_batch(rows({{2, 10}}), Objective::kThroughput)).kind,
            "memory-bound");
}

/// A trial on a fake clock: each step takes `ms(batch)` of it; the options'
/// calibration (warm-up, minimum time, slice) is honoured as the runner would.
struct FakeTimedTrial {
  batchtune::testing::FakeClock& clock;
  std::function<double(int64_t)> ms;
  std::vector<TrialOptions> asked;
  std::map<int64_t, std::vector<int64_t>> timed_steps;  // per batch, per trial

  TrialResult operator()(const TrialOptions& o) {
    asked.push_back(o);
    const double start = clock.now_s();
    TrialResult t;
    t.batch_size = o.batch_size();
    t.fits = o.batch_size() <= 64;
    const double step_s = ms(o.batch_size()) / 1e3;
    for (int64_t i = 0; i < o.warmup_steps(); ++i) clock.advance(step_s);
    double timed = 0;
    while (true) {
      const auto n = static_cast<int64_t>(t.step_seconds.size());
      if (n >= 1 && clock.now_s() - start + step_s > o.max_time_s()) break;
      if (n >= o.steps() && timed >= o.min_time_s()) break;
      // Alternately 5 % fast and slow: an interval of about ±5 %.
      const double s = step_s * (n % 2 == 0 ? 0.95 : 1.05);
      clock.advance(s);
      timed += s;
      t.step_seconds.push_back(s);
      t.wait_seconds.push_back(0);
    }
    t.steps_run = o.warmup_steps() + static_cast<int64_t>(t.step_seconds.size());
    if (!t.fits) t.step_seconds.clear();
    timed_steps[o.batch_size()].push_back(static_cast<int64_t>(t.step_seconds.size()));
    summarize_steps(t);
    return t;
  }
};

TEST(Sweep, EveryTrialFitsItsSliceAndTheSweepItsDeadline) {
  batchtune::testing::FakeClock clock;
  FakeTimedTrial fake{clock, [](int64_t b) { return 2.0 + 0.5 * static_cast<double>(b); }, {}, {}};
  SweepOptions options;
  options.clock = &clock;
  options.deadline_s = 3;  // far less than 1 s per size
  const auto grid = std::vector<int64_t>{64, 1, 2, 4, 8, 16, 32, 128};
  const SweepOutcome r = run_sweep(std::ref(fake), grid, {}, options);
  EXPECT_LE(clock.now_s(), options.deadline_s * 1.05) << "within the deadline, give or take a step";
  ASSERT_FALSE(fake.asked.empty());
  for (const auto& o : fake.asked) {
    EXPECT_LE(o.max_time_s(), options.deadline_s);
    EXPECT_GT(o.min_time_s(), 0) << "calibrated, not a fixed count";
  }
  // 128 did not fit: left out of the rows.
  for (const auto& row : r.rows) EXPECT_LE(row.batch_size, 64);
  EXPECT_FALSE(r.rows.empty());
  for (const auto& row : r.rows) EXPECT_GT(row.samples_per_s_ci.n, 0) << row.batch_size;
}

TEST(Sweep, ReMeasuresTheContendersInterleavedAndPoolsTheirSteps) {
  batchtune::testing::FakeClock clock;
  // Throughput flat from 16 on (step time proportional to the batch): 16, 32
  // and 64 are within the 2 % band by their medians but their ±5 % readings
  // cannot tell them apart.
  FakeTimedTrial fake{clock,
                      [](int64_t b) {
                        return static_cast<double>(b) * (b == 16 ? 1.01 : b == 32 ? 1.0 : 0.99);
                      },
                      {},
                      {}};
  SweepOptions options;
  options.clock = &clock;
  options.deadline_s = 60;
  const SweepOutcome r = run_sweep(std::ref(fake), {64, 16, 32}, {}, options);
  EXPECT_GT(r.remeasure_rounds, 0);
  EXPECT_GT(fake.asked.size(), 3U) << "some sizes were timed again";
  ASSERT_EQ(r.rows.size(), 3U);
  // Pooled: the chosen row's interval rests on the steps of all its trials.
  const std::vector<int64_t>& trials = fake.timed_steps[16];
  ASSERT_GT(trials.size(), 1U);
  int64_t pooled = 0;
  for (int64_t n : trials) pooled += n;
  EXPECT_EQ(r.rows[0].batch_size, 16);
  EXPECT_EQ(r.rows[0].samples_per_s_ci.n, pooled);
  EXPECT_LE(clock.now_s(), options.deadline_s * 1.05);
}

/// A trial on a fake clock whose steps a burst of load slows: a step that
/// starts before `burst_until_s` takes `burst_factor` times its time.
struct BurstTrial {
  batchtune::testing::FakeClock& clock;
  std::function<double(int64_t)> ms;
  double burst_until_s = 0;
  double burst_factor = 3;

  double step_s(int64_t batch) const {
    return ms(batch) / 1e3 * (clock.now_s() < burst_until_s ? burst_factor : 1);
  }
  TrialResult operator()(const TrialOptions& o) {
    const double start = clock.now_s();
    TrialResult t;
    t.batch_size = o.batch_size();
    t.fits = true;
    for (int64_t i = 0; i < o.warmup_steps(); ++i) clock.advance(step_s(o.batch_size()));
    double timed = 0;
    while (true) {
      const auto n = static_cast<int64_t>(t.step_seconds.size());
      const double s = step_s(o.batch_size());
      if (n >= 1 && clock.now_s() - start + s > o.max_time_s()) break;
      if (n >= o.steps() && timed >= o.min_time_s()) break;
      clock.advance(s);
      timed += s;
      t.step_seconds.push_back(s);
      t.wait_seconds.push_back(0);
    }
    t.steps_run = o.warmup_steps() + static_cast<int64_t>(t.step_seconds.size());
    summarize_steps(t);
    return t;
  }
};

// Rows timed one after another let a burst of load hit some and not others:
// every row noisy, and a plan of micro-batch 1 x 64 at "630 samples/s".
TEST(Sweep, ABurstOfLoadLandsOnARoundOfEverySizeNotOnOneRow) {
  // 64 runs at 0.9 ms a sample, 32 at 1 ms: 64 is the faster. A burst slows
  // every step that starts in the first 1.3 s threefold.
  const auto ms = [](int64_t b) { return static_cast<double>(b) * (b == 64 ? 0.9 : 1.0); };
  {
    // One after another, a calibrated trial each as the sweep timed them:
    // the burst covers all of 64's steps, and the choice flips to 32.
    batchtune::testing::FakeClock clock;
    BurstTrial burst{clock, ms, 1.3};
    std::vector<SweepRow> rows;
    for (int64_t b : {64, 32}) {
      rows.push_back(sweep_row(burst(TrialOptions()
                                         .batch_size(b)
                                         .steps(kSweepTimedSteps)
                                         .warmup_steps(kSweepWarmupSteps)
                                         .min_time_s(kSweepMinTimedSeconds))));
    }
    ASSERT_EQ(select_batch(rows, Objective::kThroughput).batch_size, 32)
        << "the premise: timed one after another, the burst flips the choice";
  }
  // Interleaved, each row's fastest step: a round of each size escapes the
  // burst, and 64 is chosen at its true speed.
  batchtune::testing::FakeClock clock;
  BurstTrial burst{clock, ms, 1.3};
  SweepOptions options;
  options.clock = &clock;
  options.deadline_s = 60;
  options.objective = Objective::kGoodput;  // no re-measurement: the rounds alone
  const SweepOutcome r = run_sweep(std::ref(burst), {64, 32}, {}, options);
  ASSERT_EQ(r.rows.size(), 2U);
  EXPECT_EQ(select_batch(r.rows, Objective::kThroughput).batch_size, 64);
  EXPECT_NEAR(r.rows[1].samples_per_s, 64 / (64 * 0.9e-3), 1e-6) << "64 at its unloaded speed";
  EXPECT_NEAR(r.rows[0].samples_per_s, 1000, 1e-6);
  // The interval stays the median's: the steps the burst slowed widen it.
  EXPECT_LT(r.rows[1].samples_per_s_ci.low, r.rows[1].samples_per_s);
}

TEST(Sweep, ReusesSearchTrialsTimedWellEnough) {
  TrialResult searched;
  searched.batch_size = 8;
  searched.fits = true;
  searched.step_seconds = std::vector<double>(kSweepTimedSteps, 0.01);
  searched.step_ms_spread = 0;
  searched.samples_per_s = 800;
  std::vector<int64_t> asked;
  const auto trial = [&](const TrialOptions& o) {
    asked.push_back(o.batch_size());
    TrialResult t;
    t.batch_size = o.batch_size();
    t.fits = true;
    t.samples_per_s = 1;
    return t;
  };
  searched.step_ms_ci = estimate_median(std::vector<double>(kSweepTimedSteps, 10.0));
  const auto r = run_sweep(trial, {4, 8}, {searched}, SweepOptions{});
  // 8 is not timed again: only 4, once a round.
  EXPECT_EQ(asked, std::vector<int64_t>(kSweepRounds, 4));
  ASSERT_EQ(r.rows.size(), 2U);
  EXPECT_DOUBLE_EQ(r.rows[1].samples_per_s, 800);
}

TEST(Sweep, BadObjectiveOrToleranceIsAUserError) {
  EXPECT_THROW(parse_objective("fastest"), Error);
  EXPECT_THROW(select_batch(rows({{1, 1}}), Objective::kThroughput, 1.5), Error);
}

}  // namespace

namespace {

TEST(Trial, RecognisesSizesThatDoNotRun) {
  using namespace batchtune;
  EXPECT_TRUE(is_size_refusal(
      "Expected more than 1 value per channel when training, got input size [1, 512, 1, 1]"));
  EXPECT_TRUE(is_size_refusal("CUDA error: invalid configuration argument"));
  EXPECT_FALSE(is_size_refusal("mat1 and mat2 shapes cannot be multiplied (4x10 and 12x3)"));
}

}  // namespace
