#include "batchtune/common/estimate.h"

#include <gtest/gtest.h>

#include <random>

#include "batchtune/monitoring/machine_load.h"

namespace {

using namespace batchtune;

TEST(Estimate, OrderStatisticsCoverTheMedianAtTheStatedLevel) {
  // Five readings: [min, max] is the best there is, at 1 - 2/32 = 93.75 %.
  const Estimate five = estimate_median({5, 1, 4, 2, 3});
  EXPECT_DOUBLE_EQ(five.median, 3);
  EXPECT_DOUBLE_EQ(five.low, 1);
  EXPECT_DOUBLE_EQ(five.high, 5);
  EXPECT_NEAR(five.level, 0.9375, 1e-12);
  EXPECT_EQ(five.n, 5);
  // Six: [min, max] at 1 - 2/64 = 96.9 %.
  EXPECT_NEAR(estimate_median({1, 2, 3, 4, 5, 6}).level, 1 - 2.0 / 64, 1e-12);
  // Twenty: x(6)..x(15), 95.9 % (the binomial tables' value).
  std::vector<double> twenty;
  for (int i = 1; i <= 20; ++i) twenty.push_back(i);
  const Estimate e = estimate_median(twenty);
  EXPECT_DOUBLE_EQ(e.low, 6);
  EXPECT_DOUBLE_EQ(e.high, 15);
  EXPECT_NEAR(e.level, 0.9586, 1e-4);
  EXPECT_GE(e.level, kConfidenceLevel);
  // None and one.
  EXPECT_EQ(estimate_median({}).n, 0);
  EXPECT_TRUE(estimate_median({7}).noisy());
}

TEST(Estimate, IntervalsNarrowWithMoreReadingsAndStayRepeatable) {
  std::mt19937 rng(3);
  std::lognormal_distribution<double> step(0.0, 0.1);
  std::vector<double> readings;
  for (int i = 0; i < 2000; ++i) readings.push_back(step(rng));
  const Estimate many = estimate_median(readings);
  const Estimate few = estimate_median(std::vector<double>(readings.begin(), readings.begin() + 10));
  EXPECT_LT(many.high - many.low, few.high - few.low);
  EXPECT_NEAR(many.median, 1.0, 0.02);
  EXPECT_LT(many.relative_half_width(), 0.02);
  const Estimate again = estimate_median(readings);
  EXPECT_DOUBLE_EQ(again.low, many.low);
  EXPECT_DOUBLE_EQ(again.high, many.high);
}

TEST(Estimate, ARateIsTheReciprocalOfATime) {
  const Estimate ms = estimate_median({9, 10, 10, 10, 11, 12});
  const Estimate rate = ms.reciprocal(1000.0 * 32);  // batch 32, ms → samples/s
  EXPECT_DOUBLE_EQ(rate.median, 3200);
  EXPECT_DOUBLE_EQ(rate.low, 32000.0 / 12);
  EXPECT_DOUBLE_EQ(rate.high, 32000.0 / 9);
  EXPECT_DOUBLE_EQ(rate.level, ms.level);
}

TEST(Estimate, WideIntervalsAreNoisy) {
  EXPECT_FALSE(estimate_median({99, 100, 100, 100, 101, 100}).noisy());
  EXPECT_TRUE(estimate_median({50, 100, 100, 100, 200, 100}).noisy());
  EXPECT_EQ(format_level(0.95), "95 %");
  EXPECT_EQ(format_level(0.9375), "93.8 %");
}

TEST(MachineLoad, NamesOtherProcessesAndSteal) {
  CpuTimes before;
  before.valid = true;
  before.cores = 2;
  CpuTimes after = before;
  after.total_s = 20;  // 10 s on 2 cores
  after.busy_s = 19;
  after.own_s = 10;    // this process: one core; others: 0.9 of one
  EXPECT_EQ(machine_load_cause(before, after), "other processes used 0.9 of 2 cores");
  after.steal_s = 1;
  EXPECT_EQ(machine_load_cause(before, after),
            "other processes used 0.9 of 2 cores; CPU steal 5 %");
  CpuTimes quiet = before;
  quiet.total_s = 20;
  quiet.busy_s = 10.5;
  quiet.own_s = 10;
  EXPECT_EQ(machine_load_cause(before, quiet), "");
  EXPECT_EQ(machine_load_cause(CpuTimes{}, after), "") << "no reading, no cause";
  EXPECT_TRUE(read_cpu_times().valid) << "Linux has /proc/stat";
}

}  // namespace
