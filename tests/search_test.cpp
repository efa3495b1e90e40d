#include "batchtune/tuning/search.h"
#include "batchtune/common/option.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "batchtune/memory/budget_allocator.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/common/error.h"
#include "batchtune/step/workload.h"
#include "fake_clock.h"

namespace {

using namespace batchtune;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kUsable = 1000 * kMiB;

/// A made-up device: a trial fits when peak(b) stays within kUsable.
TrialFunction fake_device(std::function<double(int64_t)> peak_mib) {
  return [peak_mib](int64_t b) {
    TrialResult r;
    r.batch_size = b;
    r.usable_bytes = kUsable;
    r.capacity_bytes = kUsable;
    r.steps_run = 2;
    const auto peak = static_cast<int64_t>(peak_mib(b) * kMiB);
    r.fits = peak <= kUsable;
    // An out-of-memory stops at the failing allocation: peak at most usable.
    r.peak_bytes = std::min(peak, kUsable);
    if (!r.fits) r.failure = TrialFailure::kOutOfMemory;
    return r;
  };
}

/// The true limit by brute force over the fake curve.
int64_t true_max(const TrialFunction& trial, int64_t cap) {
  int64_t best = 0;
  for (int64_t b = 1; b <= cap; ++b) {
    if (trial(b).fits) best = b;
  }
  return best;
}

/// "2+ 16+ 128- ...": the sizes tried, + for fits, for failure messages.
std::string describe(const SearchResult& r) {
  std::string out;
  for (const auto& t : r.trials) out += std::to_string(t.batch_size) + (t.fits ? "+ " : "- ");
  return out;
}

SearchResult run(const TrialFunction& device, SearchStrategy strategy, int64_t cap = 8192) {
  return search_max_batch(device, SearchOptions().strategy(strategy).max_batch(cap));
}

TEST(Search, PredictOnALinearCurve) {
  const auto device = fake_device([](int64_t b) { return 100 + 1.0 * b; });
  const SearchResult r = run(device, SearchStrategy::kPredict);
  EXPECT_EQ(r.max_batch_size, 900);
  EXPECT_EQ(r.max_batch_size, true_max(device, 2000));
  // 2 and 16 for the line, 128 to scout, 900 predicted; the line through
  // 128 and 900 says nothing larger fits; 900 once more to confirm it.
  EXPECT_EQ(r.trials.size(), 5u) << describe(r);
  EXPECT_EQ(r.trials.back().batch_size, 900);
  EXPECT_TRUE(r.confirmed);
  EXPECT_EQ(r.steps, 10);
  EXPECT_FALSE(r.smallest_failure.has_value());
  EXPECT_NE(r.stop_reason.find("within 2 %"), std::string::npos) << r.stop_reason;
}

TEST(Search, BaselinesOnALinearCurve) {
  const auto device = fake_device([](int64_t b) { return 100 + 1.0 * b; });
  const SearchResult power = run(device, SearchStrategy::kPower);
  EXPECT_EQ(power.max_batch_size, 512);  // Lightning's power mode: 57 % of the limit
  EXPECT_EQ(power.trials.size(), 10u);   // 2, 4, ..., 1024
  const SearchResult bins = run(device, SearchStrategy::kBinsearch);
  EXPECT_EQ(bins.max_batch_size, 900);
  EXPECT_EQ(bins.trials.size(), 20u);  // 10 doublings, 9 bisections, 1 confirmation
  const SearchResult backoff = run(device, SearchStrategy::kBackoff);
  EXPECT_EQ(backoff.max_batch_size, 128);  // fits at once: never learns there is more
  EXPECT_EQ(backoff.trials.size(), 1u);
}

TEST(Search, PredictWithinToleranceOnAStepCurve) {
  // Allocator rounding: memory grows in 32 MiB steps.
  const auto device =
      fake_device([](int64_t b) { return 200 + 32.0 * std::ceil(b * 3.0 / 32.0); });
  const int64_t truth = true_max(device, 2000);
  const SearchResult r = run(device, SearchStrategy::kPredict);
  EXPECT_LE(r.max_batch_size, truth);
  EXPECT_GE(r.max_batch_size, truth / 1.02);
  EXPECT_EQ(r.max_batch_size, 261) << describe(r);
  EXPECT_EQ(truth, 266);
  // 2 16 128, 273 predicted fails, bisect to 200; the line through 200 and
  // 261 puts the limit within 2 % of 261; 261 confirmed.
  EXPECT_EQ(r.trials.size(), 7u) << describe(r);
}

TEST(Search, PredictOnANoisyCurve) {
  std::mt19937 rng(3);
  std::vector<double> noise(4096);
  std::normal_distribution<double> normal(0, 4);
  for (auto& n : noise) n = normal(rng);
  const auto device = fake_device([&](int64_t b) { return 50 + 2.5 * b + noise[b]; });
  const int64_t truth = true_max(device, 1000);
  const SearchResult r = run(device, SearchStrategy::kPredict);
  EXPECT_GE(r.max_batch_size, truth / 1.02);
  EXPECT_LE(r.max_batch_size, truth);
  EXPECT_EQ(r.trials.size(), 5u) << describe(r);  // 4 and the confirmation
}

TEST(Search, PredictOnACurveWithACliff) {
  // A convolution workspace that appears past 300 samples.
  const auto device =
      fake_device([](int64_t b) { return 100 + 1.0 * b + (b > 300 ? 500.0 : 0.0); });
  EXPECT_EQ(true_max(device, 2000), 400);
  const SearchResult r = run(device, SearchStrategy::kPredict);
  EXPECT_EQ(r.max_batch_size, 400);
  // The line from below the cliff predicts 900: bisection finds the cliff,
  // and the line past it (343, 400) the limit; then 400 confirmed.
  EXPECT_EQ(r.trials.size(), 9u) << describe(r);
}

TEST(Search, AnAnswerThatNoLongerFitsWhenConfirmedReopensTheSearchBelowIt) {
  // Every trial leaves 10 MiB behind (caches, workspaces): the limit creeps
  // down while the search runs, as on a real device.
  int trials = 0;
  const TrialFunction device = [&](int64_t b) {
    const double leftover = 10.0 * trials++;
    return fake_device([&](int64_t n) { return 100 + 1.0 * n + leftover; })(b);
  };
  const SearchResult r = search_max_batch(device, SearchOptions());
  ASSERT_GE(r.trials.size(), 2U);
  const auto& last = r.trials.back();
  EXPECT_TRUE(last.fits) << describe(r);
  EXPECT_EQ(last.batch_size, r.max_batch_size) << describe(r);
  EXPECT_TRUE(r.confirmed) << describe(r);
  // The answer fits with everything the search left behind.
  EXPECT_LE(100 + r.max_batch_size + 10 * (trials - 1), 1000) << describe(r);
  EXPECT_NE(r.stop_reason.find("confirmed"), std::string::npos) << r.stop_reason;
  // The first answer failed its confirmation and the search went on below it.
  bool reopened = false;
  for (size_t i = 0; i < r.trials.size(); ++i) {
    for (size_t j = i + 1; j < r.trials.size(); ++j) {
      reopened |= r.trials[i].fits && !r.trials[j].fits &&
                  r.trials[i].batch_size == r.trials[j].batch_size;
    }
  }
  EXPECT_TRUE(reopened) << describe(r);
  // Without confirmation the search returns that first, larger answer.
  trials = 0;
  const SearchResult unconfirmed = search_max_batch(device, SearchOptions().confirm(false));
  EXPECT_GT(unconfirmed.max_batch_size, r.max_batch_size) << describe(unconfirmed);
}

TEST(Search, OneFitAndAFailureAboveItBisectsNotOneByOne) {
  // 2 fits and 16 fails: the limit (9) is found by halving the bracket, not
  // by trying 15, 14, 13, ... (the text:DIR report: seven failures in a row).
  const auto device = fake_device([](int64_t b) { return 100 * static_cast<double>(b) + 100; });
  const SearchResult r = search_max_batch(device, SearchOptions().tolerance(0));
  EXPECT_EQ(r.max_batch_size, 9) << describe(r);
  int failures_in_a_row = 0;
  int worst = 0;
  for (const auto& t : r.trials) {
    failures_in_a_row = t.fits ? 0 : failures_in_a_row + 1;
    worst = std::max(worst, failures_in_a_row);
  }
  EXPECT_LE(worst, 2) << describe(r);
  EXPECT_LE(r.trials.size(), 7U) << describe(r);
}

TEST(Search, LimitBelowBatchSizeOne) {
  const auto device = fake_device([](int64_t b) { return 1200 + 1.0 * b; });
  const SearchResult r = run(device, SearchStrategy::kPredict);
  EXPECT_EQ(r.max_batch_size, 0);
  EXPECT_EQ(r.trials.size(), 2u) << describe(r);  // 2, then 1
  EXPECT_EQ(r.stop_reason, "not even batch size 1 fits");
}

TEST(Search, NeverPassesMaxBatch) {
  const auto device = fake_device([](int64_t b) { return 0.001 * b; });
  for (auto strategy : {SearchStrategy::kPredict, SearchStrategy::kPower,
                        SearchStrategy::kBinsearch}) {
    const SearchResult r = run(device, strategy, 100);
    EXPECT_EQ(r.max_batch_size, 100) << to_string(strategy);
    EXPECT_TRUE(r.hit_max_batch);
    for (const auto& t : r.trials) EXPECT_LE(t.batch_size, 100);
  }
}

TEST(Search, StopsAtTheTimeBudgetWithTheBestSoFar) {
  const auto device = fake_device([](int64_t b) { return 100 + 1.0 * b; });
  batchtune::testing::FakeClock clock;
  const auto slow = [&](int64_t b) {
    clock.advance(10);  // every trial takes 10 s
    return device(b);
  };
  const SearchResult r = search_max_batch(
      slow, SearchOptions().strategy(SearchStrategy::kBinsearch).time_budget_s(35), clock);
  EXPECT_TRUE(r.hit_time_budget);
  EXPECT_EQ(r.trials.size(), 4u) << describe(r);
  EXPECT_EQ(r.max_batch_size, 16);
  EXPECT_NE(r.stop_reason.find("time budget"), std::string::npos);
}

TEST(Search, AnAnswerTheBudgetCutShortSaysItIsALowerBound) {
  // A starved search returned 2 where 35 fits, and looked whole.
  const auto device = fake_device([](int64_t b) { return 100 + 1.0 * b; });
  batchtune::testing::FakeClock clock;
  const auto slow = [&](int64_t b) {
    clock.advance(10);
    return device(b);
  };
  const SearchResult cut = search_max_batch(
      slow, SearchOptions().strategy(SearchStrategy::kBinsearch).time_budget_s(35), clock);
  ASSERT_TRUE(cut.hit_time_budget);
  EXPECT_TRUE(cut.lower_bound) << describe(cut);
  EXPECT_NE(cut.stop_reason.find(std::to_string(cut.max_batch_size) + " is a lower bound"),
            std::string::npos)
      << cut.stop_reason;
  // Given the time, the same search closes on the limit: no lower bound.
  const SearchResult whole = search_max_batch(
      slow, SearchOptions().strategy(SearchStrategy::kBinsearch).time_budget_s(100000), clock);
  EXPECT_FALSE(whole.hit_time_budget);
  EXPECT_FALSE(whole.lower_bound) << describe(whole);
}

TEST(Search, TheAnswerWasTriedAndFitted) {
  const auto device = fake_device([](int64_t b) { return 10 + 0.37 * b * std::log2(b + 1); });
  for (auto strategy : {SearchStrategy::kPredict, SearchStrategy::kPower,
                        SearchStrategy::kBinsearch, SearchStrategy::kBackoff}) {
    const SearchResult r = run(device, strategy);
    bool found = false;
    for (const auto& t : r.trials) found |= t.batch_size == r.max_batch_size && t.fits;
    EXPECT_TRUE(found) << to_string(strategy);
  }
}

TEST(Search, BadOptionsAreUserErrors) {
  const auto device = fake_device([](int64_t b) { return 1.0 * b; });
  EXPECT_THROW(search_max_batch(device, SearchOptions().max_batch(0)), Error);
  EXPECT_THROW(search_max_batch(device, SearchOptions().time_budget_s(0)), Error);
  EXPECT_THROW(search_max_batch(device, SearchOptions().tolerance(1)), Error);
  EXPECT_THROW(parse_search_strategy("random"), Error);
}

TEST(Search, ItsToleranceIsNamedAsTheSearchTolerance) {
  const auto device = fake_device([](int64_t b) { return 1.0 * b; });
  try {
    search_max_batch(device, SearchOptions().tolerance(1));
    FAIL() << "no error";
  } catch (const OptionError& e) {
    EXPECT_EQ(e.option(), Option::kSearchTolerance);
    EXPECT_EQ(std::string(e.what()).rfind("--search-tolerance: ", 0), 0u) << e.what();
    EXPECT_EQ(e.message(FrontEnd::kPython).rfind("search_tolerance: ", 0), 0u);
  }
}

TEST(Search, RealPathOnTheCpuBudget) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 48 * kMiB);
  Workload workload(WorkloadOptions().model("convnet").input_shape({3, 32, 32}));
  TrialRunner runner(workload, *memory);
  const auto trial = [&](int64_t b) {
    return runner.run(TrialOptions().batch_size(b).steps(1).warmup_steps(1));
  };
  const SearchResult r = search_max_batch(trial, SearchOptions());
  ASSERT_GT(r.max_batch_size, 16);
  EXPECT_TRUE(trial(r.max_batch_size).fits);
  const auto above = static_cast<int64_t>(std::ceil(r.max_batch_size * 1.05));
  EXPECT_FALSE(trial(above).fits);
  EXPECT_LE(r.trials.size(), 7u);
}

}  // namespace
