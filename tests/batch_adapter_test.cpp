#include "batchtune/training/batch_adapter.h"

#include <gtest/gtest.h>

#include <cmath>

#include "batchtune/common/error.h"
#include "batchtune/step/noise_scale.h"

namespace batchtune {
namespace {

// Measures `batch` at `samples_per_s` over one window of 1 s.
void run_at(BatchAdapter& adapter, int64_t batch, double samples_per_s) {
  adapter.observe(batch, 1.0, static_cast<int64_t>(samples_per_s));
}

TEST(BatchAdapter, ANegativeNoiseEstimateCountsAsNoNoise) {
  // An early estimate below 0 (a difference of noisy norms) is no noise: a
  // larger batch is no more efficient, and the decision does not fail.
  BatchAdapter adapter(64, 1e-3, LrScaling::kSqrt, 1, AdaptOptions().min_global_batch(64));
  adapter.observe(64, 1.0, 6400);
  EXPECT_FALSE(adapter.decide(50, 64, -0.8, 10).has_value());
  EXPECT_FALSE(adapter.decide(100, 64, -0.8, 10, NoiseInterval{0, 0}).has_value());
  // Below the start, a smaller batch is twice as efficient: tried.
  BatchAdapter below(64, 1e-3, LrScaling::kSqrt, 1);
  below.observe(64, 1.0, 6400);
  const auto tried = below.decide(50, 64, -0.8, 10);
  ASSERT_TRUE(tried);
  EXPECT_EQ(tried->global_batch_size, 32);
}

TEST(BatchAdapter, AWindowTimesItsBatchUnlessAnOutOfMemoryChangedTheMicroBatchInIt) {
  BatchAdapter adapter(64, 1e-3, LrScaling::kSqrt, 1);
  adapter.end_window(64, 2.0, 6400);  // from (0 s, 0 samples): 3200/s
  EXPECT_DOUBLE_EQ(adapter.speed(64).value_or(0), 3200);
  adapter.cap_micro_batch(32);
  adapter.end_window(64, 4.0, 12800);  // an out-of-memory in it: not observed
  EXPECT_DOUBLE_EQ(adapter.speed(64).value_or(0), 3200);
  adapter.end_window(64, 5.0, 14400);  // the next one is: 1600/s over 1 s
  EXPECT_DOUBLE_EQ(adapter.speed(64).value_or(0), (6400 + 1600) / 3.0);
  adapter.restart_window(10.0, 20000);  // a change took effect late: time from here
  adapter.end_window(128, 11.0, 26400);
  EXPECT_DOUBLE_EQ(adapter.speed(128).value_or(0), 6400);
  // The decision on an estimator reads its estimate, count and interval.
  NoiseScaleEstimator noise;
  EXPECT_FALSE(adapter.decide(50, 128, noise).has_value()) << "no measurement yet";
}

TEST(BatchAdapter, AWindowAfterTheStartOrAChangeTimesItsStepsOnceTheFirstSettled) {
  // Every 50 steps: the first 5 after the start or a change are not timed.
  BatchAdapter adapter(64, 1e-3, LrScaling::kSqrt, 1);
  ASSERT_EQ(adapter.options().every() / kAdaptSettleShare, 5);
  for (int step = 1; step < 5; ++step) EXPECT_FALSE(adapter.settles()) << step;
  EXPECT_TRUE(adapter.settles());
  adapter.start_timing(3.0, 320);  // 5 slow steps: 3 s for 320 samples
  for (int step = 6; step <= 50; ++step) EXPECT_FALSE(adapter.settles()) << step;
  adapter.end_window(64, 3.9, 3200);  // 45 steps in 0.9 s
  EXPECT_DOUBLE_EQ(adapter.speed(64).value_or(0), 2880 / 0.9);
  // A window without a change times all its steps.
  adapter.end_window(64, 4.9, 6400);
  EXPECT_DOUBLE_EQ(adapter.speed(64).value_or(0), (2880 + 3200) / 1.9);
  // A change settles again, as does a window restarted where it took effect.
  ASSERT_TRUE(adapter.decide(100, 64, 1000.0, 10));
  for (int step = 1; step < 5; ++step) EXPECT_FALSE(adapter.settles()) << step;
  EXPECT_TRUE(adapter.settles());
  adapter.restart_window(6.0, 7000);
  for (int step = 1; step < 5; ++step) EXPECT_FALSE(adapter.settles()) << step;
  EXPECT_TRUE(adapter.settles());
  // A window shorter than ten steps has nothing to settle.
  BatchAdapter every_step(64, 1e-3, LrScaling::kSqrt, 1, AdaptOptions().every(9));
  EXPECT_FALSE(every_step.settles());
}

TEST(BatchAdapter, WaitsForEnoughNoiseMeasurements) {
  BatchAdapter adapter(64, 1e-3, LrScaling::kSqrt, 1);
  run_at(adapter, 64, 1000);
  EXPECT_FALSE(adapter.decide(50, 64, std::nullopt, 0));
  EXPECT_FALSE(adapter.decide(50, 64, 500.0, kAdaptMinMeasurements - 1));
}

TEST(BatchAdapter, TriesALargerBatchOnceAndGoesBackWhenItIsNotFaster) {
  // Never below the start: the larger batch alone is weighed.
  BatchAdapter adapter(64, 1e-3, LrScaling::kSqrt, 1, AdaptOptions().min_global_batch(64));
  run_at(adapter, 64, 1000);
  const auto tried = adapter.decide(50, 64, 100.0, 10);
  ASSERT_TRUE(tried);
  EXPECT_EQ(tried->global_batch_size, 128);
  EXPECT_NE(tried->reason.find("trying global batch 128"), std::string::npos) << tried->reason;
  // As fast per sample at 128: efficiency alone falls, so back to 64.
  run_at(adapter, 128, 1000);
  const auto back = adapter.decide(100, 128, 100.0, 15);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->global_batch_size, 64);
  EXPECT_NE(back->reason.find("back to 64"), std::string::npos) << back->reason;
  // Measured now, 128 is not tried again while its goodput stays lower.
  EXPECT_FALSE(adapter.decide(150, 64, 100.0, 20));
}

TEST(BatchAdapter, KeepsTheLargerBatchWhenItsGoodputIsHigher) {
  BatchAdapter adapter(64, 1e-3, LrScaling::kSqrt, 1);
  run_at(adapter, 64, 1000);
  ASSERT_TRUE(adapter.decide(50, 64, 1000.0, 10));
  // 1.5x the throughput at 128 with noise scale 1000: E = 1064/1128, goodput
  // 1415 against 1000.
  run_at(adapter, 128, 1500);
  EXPECT_FALSE(adapter.decide(100, 128, 1000.0, 15)) << "stays at 128";
}

TEST(BatchAdapter, GrowsToAMeasuredLargerBatchOnlyOnceTheNoiseScaleMakesItWorthIt) {
  // Never below the start: the larger batch alone is weighed.
  BatchAdapter adapter(64, 1e-3, LrScaling::kSqrt, 1, AdaptOptions().min_global_batch(64));
  run_at(adapter, 64, 1000);
  run_at(adapter, 128, 1200);  // 1.2x faster per sample
  // Noise scale 50: E(128) = 114 / 178 = 0.64, goodput 769 < 1000.
  EXPECT_FALSE(adapter.decide(50, 64, 50.0, 10));
  // Noise scale 5000: E(128) = 5064 / 5128 = 0.988, goodput 1185 > 1050.
  const auto grown = adapter.decide(100, 64, 5000.0, 20);
  ASSERT_TRUE(grown);
  EXPECT_EQ(grown->global_batch_size, 128);
  EXPECT_EQ(grown->noise_scale, 5000.0);
}

TEST(BatchAdapter, HysteresisKeepsASmallGainFromChangingTheBatch) {
  BatchAdapter adapter(64, 1e-3, LrScaling::kSqrt, 1);
  run_at(adapter, 64, 1000);
  run_at(adapter, 128, 1030);
  // Efficiency ~1 (huge noise scale): 3 % more goodput is under kAdaptMinGain.
  EXPECT_FALSE(adapter.decide(50, 64, 1e9, 10));
}

TEST(BatchAdapter, AccumulationAloneIsNeverTriedForSpeed) {
  BatchAdapter adapter(64, 1e-3, LrScaling::kSqrt, 1);
  adapter.cap_micro_batch(64);  // an out-of-memory said 64 is the most that fits
  run_at(adapter, 64, 1000);
  EXPECT_FALSE(adapter.decide(50, 64, 1e4, 10)) << "128 would be 64 x 2 at the same speed";
  EXPECT_EQ(adapter.split(128), std::make_pair(int64_t{64}, int64_t{2}));
}

TEST(BatchAdapter, NeverLeavesItsBounds) {
  BatchAdapter adapter(64, 1e-3, LrScaling::kSqrt, 1, AdaptOptions().max_global_batch(64));
  run_at(adapter, 64, 1000);
  EXPECT_FALSE(adapter.decide(50, 64, 1e6, 10)) << "64 is also the largest";
  BatchAdapter bigger(64, 1e-3, LrScaling::kSqrt, 1);
  EXPECT_EQ(bigger.max_global_batch(), 64 * kDefaultAdaptGrowth);
  run_at(bigger, 64, 10);  // slow, but there is nothing below the start
  run_at(bigger, 128, 10000);
  const auto change = bigger.decide(50, 128, 1.0, 10);
  EXPECT_TRUE(!change || change->global_batch_size >= 64);
}

TEST(BatchAdapter, ShrinksAStartTooLargeForTheNoiseUntilTheSpeedLostOutweighsTheEfficiency) {
  // A tune's throughput-golden 512 early in training (noise scale 300), at
  // this CPU's speeds: 512 9000, 256 8600, 128 8000, 64 6600 samples/s.
  BatchAdapter adapter(512, 1e-3, LrScaling::kSqrt, 1);
  EXPECT_EQ(adapter.min_global_batch(), 512 / kDefaultAdaptGrowth);
  run_at(adapter, 512, 9000);
  // 256 not run yet: at 512's speed its efficiency (812/556 = 1.46x) wins.
  const auto tried = adapter.decide(50, 512, 300.0, 10);
  ASSERT_TRUE(tried);
  EXPECT_EQ(tried->global_batch_size, 256);
  EXPECT_NE(tried->reason.find("trying global batch 256"), std::string::npos) << tried->reason;
  EXPECT_LT(tried->lr, 1e-3) << "a smaller batch, a smaller lr";
  run_at(adapter, 256, 8600);
  EXPECT_FALSE(adapter.decide(100, 256, 300.0, 15)) << "256 measured better: it stays";
  const auto smaller = adapter.decide(150, 256, 300.0, 20);
  ASSERT_TRUE(smaller);
  EXPECT_EQ(smaller->global_batch_size, 128);
  run_at(adapter, 128, 8000);
  EXPECT_FALSE(adapter.decide(200, 128, 300.0, 25)) << "128: 8000 x 1.90 against 8600 x 1.46";
  const auto to_64 = adapter.decide(250, 128, 300.0, 30);
  ASSERT_TRUE(to_64);
  EXPECT_EQ(to_64->global_batch_size, 64);
  run_at(adapter, 64, 6600);
  // 64: 6600 x 2.23 = 14,723 against 128's 8000 x 1.90 = 15,177: back.
  const auto back = adapter.decide(300, 64, 300.0, 35);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->global_batch_size, 128);
  EXPECT_NE(back->reason.find("back to 128 after trying 64"), std::string::npos) << back->reason;
  EXPECT_FALSE(adapter.decide(350, 128, 300.0, 40)) << "both neighbours measured worse";
  // --adapt-min-batch at the start: never below it.
  BatchAdapter floor(512, 1e-3, LrScaling::kSqrt, 1, AdaptOptions().min_global_batch(512));
  run_at(floor, 512, 9000);
  const auto up = floor.decide(50, 512, 300.0, 10);
  ASSERT_TRUE(up) << "1024 could run up to twice as fast: tried";
  EXPECT_EQ(up->global_batch_size, 1024);
}

TEST(BatchAdapter, UnderAMicroBatchCapAShrinkMovesTheAccumulationWithoutATry) {
  // 256 as 4 micro-batches of 64: 128 is 2 of them, at today's speed and
  // more efficient (noise scale 100: 356/228 = 1.56x), so it is taken at once.
  BatchAdapter adapter(256, 1e-3, LrScaling::kSqrt, 1);
  adapter.cap_micro_batch(64);
  run_at(adapter, 256, 1000);
  const auto change = adapter.decide(50, 256, 100.0, 10);
  ASSERT_TRUE(change);
  EXPECT_EQ(change->global_batch_size, 128);
  EXPECT_EQ(change->micro_batch_size, 64);
  EXPECT_EQ(change->accumulation_steps, 2);
  EXPECT_EQ(change->reason.find("trying"), std::string::npos) << change->reason;
}

TEST(BatchAdapter, TheTunesSpeedsDecideWhatIsWorthATry) {
  // At 64 (10,000 samples/s), noise scale 300, likely 250-350: without a
  // profile, 32 could be as fast and at the high end is 8 % more efficient
  // ((350 + 64) / (350 + 32)): tried. The tune measured 32 at 0.7x 64's
  // speed and 128 at 1.1x: neither can win, so nothing is tried.
  const NoiseInterval noise{250, 350};
  BatchAdapter hopeful(64, 1e-3, LrScaling::kSqrt, 1);
  run_at(hopeful, 64, 10000);
  const auto tried = hopeful.decide(50, 64, 300.0, 10, noise);
  ASSERT_TRUE(tried);
  EXPECT_EQ(tried->global_batch_size, 32);
  const SpeedProfile tune{{32, 7000}, {64, 10000}, {128, 11000}};
  BatchAdapter informed(64, 1e-3, LrScaling::kSqrt, 1, AdaptOptions().speed_profile(tune));
  run_at(informed, 64, 10000);
  EXPECT_FALSE(informed.decide(50, 64, 300.0, 10, noise).has_value());
  // Where the tune measured 128 at 1.5x (and training runs 64 at 8,000
  // samples/s, so 128 is expected at 12,000), a noise scale of 1,000 makes
  // it worth a try: 12,000 x (1000 + 64) / (1000 + 128) = 11,319 > 8,000.
  BatchAdapter steep(64, 1e-3, LrScaling::kSqrt, 1,
                     AdaptOptions().speed_profile({{32, 5000}, {64, 10000}, {128, 15000}}));
  run_at(steep, 64, 8000);
  const auto grown = steep.decide(50, 64, 1000.0, 10, NoiseInterval{1000, 1000});
  ASSERT_TRUE(grown);
  EXPECT_EQ(grown->global_batch_size, 128);
  EXPECT_NE(grown->reason.find("1.50x today's throughput the tune measured"), std::string::npos)
      << grown->reason;
  // A try is still a try: measured slower than expected, the run goes back.
  run_at(steep, 128, 8400);
  const auto back = steep.decide(100, 128, 1000.0, 15, NoiseInterval{1000, 1000});
  ASSERT_TRUE(back);
  EXPECT_EQ(back->global_batch_size, 64);
  // A resume keeps the profile of the tune its run started from.
  BatchAdapter restored(64, 1e-3, LrScaling::kSqrt, 1);
  restored.load_state(informed.state());
  EXPECT_FALSE(restored.decide(50, 64, 300.0, 10, noise).has_value());
}

TEST(BatchAdapter, ATunesIntervalsGiveATryWhereItsMedianWouldNot) {
  // At 64 (10,000 samples/s), noise scale 300, likely 250-350: at the high
  // end 32 is 8.4 % more efficient. The tune's medians put 32 at 0.93x 64's
  // speed (a goodput of 1.008x: no try), but their intervals allow 32 up to
  // 10,300 / 9,700 = 1.06x (1.15x the goodput): the tune could not tell, so
  // one window measures it. 128, at most 10,800 / 9,700 = 1.11x as fast and
  // at the low end 17 % less efficient, is tried by neither.
  const NoiseInterval noise{250, 350};
  BatchAdapter medians(64, 1e-3, LrScaling::kSqrt, 1,
                       AdaptOptions().speed_profile({{32, 9300}, {64, 10000}, {128, 10500}}));
  run_at(medians, 64, 10000);
  EXPECT_FALSE(medians.decide(50, 64, 300.0, 10, noise).has_value());
  const SpeedProfile tune{{32, TunedSpeed(9300, 8800, 10300)},
                          {64, TunedSpeed(10000, 9700, 10400)},
                          {128, TunedSpeed(10500, 10200, 10800)}};
  BatchAdapter intervals(64, 1e-3, LrScaling::kSqrt, 1, AdaptOptions().speed_profile(tune));
  run_at(intervals, 64, 10000);
  const nlohmann::json saved = intervals.state();
  const auto tried = intervals.decide(50, 64, 300.0, 10, noise);
  ASSERT_TRUE(tried);
  EXPECT_EQ(tried->global_batch_size, 32);
  EXPECT_NE(tried->reason.find("the tune measured 0.93x, its intervals allow 1.06x"),
            std::string::npos)
      << tried->reason;
  // A sweep too noisy to say anything says no more than no sweep: 32 at up
  // to the same speed, not the 3x its intervals would allow.
  BatchAdapter noisy(64, 1e-3, LrScaling::kSqrt, 1,
                     AdaptOptions().speed_profile({{32, TunedSpeed(9300, 4000, 15000)},
                                                   {64, TunedSpeed(10000, 5000, 15000)}}));
  run_at(noisy, 64, 10000);
  const auto capped = noisy.decide(50, 64, 300.0, 10, noise);
  ASSERT_TRUE(capped);
  EXPECT_NE(capped->reason.find("at up to 1.00x today's throughput (the tune measured 0.93x, "
                                "its intervals allow 3.00x)"),
            std::string::npos)
      << capped->reason;
  // The intervals go into the state, and a state written before they were
  // kept reads as medians alone.
  BatchAdapter restored(64, 1e-3, LrScaling::kSqrt, 1);
  restored.load_state(saved);
  EXPECT_TRUE(restored.decide(50, 64, 300.0, 10, noise).has_value());
  nlohmann::json old = saved;
  for (auto& p : old["speed_profile"]) {
    p.erase("low");
    p.erase("high");
  }
  BatchAdapter from_old(64, 1e-3, LrScaling::kSqrt, 1);
  from_old.load_state(old);
  EXPECT_FALSE(from_old.decide(50, 64, 300.0, 10, noise).has_value());
}

TEST(BatchAdapter, TheLrFollowsTheAdaScaleGainUnderThePlansRule) {
  BatchAdapter linear(64, 0.1, LrScaling::kLinear, 1);
  // Gain r = (B/B0) E(B): 2 x (100 + 64) / (100 + 128) = 1.4386.
  const double gain = 2.0 * (100.0 + 64) / (100.0 + 128);
  EXPECT_DOUBLE_EQ(linear.lr_for(128, 100), 0.1 * gain);
  EXPECT_DOUBLE_EQ(linear.lr_for(64, 100), 0.1) << "the start keeps its lr";
  // All noise: the gain is the batch ratio; no noise: no gain at all.
  EXPECT_NEAR(linear.lr_for(128, 1e12), 0.2, 1e-9);
  EXPECT_NEAR(linear.lr_for(128, 0), 0.1, 1e-12);
  BatchAdapter sqrt_rule(64, 1e-3, LrScaling::kSqrt, 1);
  EXPECT_DOUBLE_EQ(sqrt_rule.lr_for(128, 100), 1e-3 * std::sqrt(gain));
  BatchAdapter none(64, 1e-3, LrScaling::kNone, 1);
  EXPECT_DOUBLE_EQ(none.lr_for(128, 100), 1e-3);
  // --adapt-lr batch: the plan's rule on the batch ratio, whatever the noise.
  BatchAdapter by_batch(64, 1e-3, LrScaling::kSqrt, 1, AdaptOptions().lr(AdaptLr::kBatch));
  EXPECT_DOUBLE_EQ(by_batch.lr_for(128, 100), 1e-3 * std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(by_batch.lr_for(128, 0), 1e-3 * std::sqrt(2.0));
}

TEST(BatchAdapter, SplitsTheLocalBatchUnderTheMicroBatchCap) {
  BatchAdapter adapter(48, 1e-3, LrScaling::kSqrt, 2);
  EXPECT_EQ(adapter.split(96), std::make_pair(int64_t{48}, int64_t{1})) << "no cap yet";
  adapter.cap_micro_batch(20);
  EXPECT_EQ(adapter.split(96), std::make_pair(int64_t{16}, int64_t{3}));  // 48 per rank
  adapter.cap_micro_batch(30);
  EXPECT_EQ(adapter.micro_batch_cap(), 20) << "a cap only shrinks";
}

TEST(BatchAdapter, ItsStateRoundTripsForACheckpoint) {
  BatchAdapter adapter(64, 1e-3, LrScaling::kSqrt, 1);
  run_at(adapter, 64, 1000);
  ASSERT_TRUE(adapter.decide(50, 64, 100.0, 10));  // an exploration under way
  BatchAdapter restored(64, 1e-3, LrScaling::kSqrt, 1);
  restored.load_state(adapter.state());
  EXPECT_EQ(restored.speed(64), adapter.speed(64));
  run_at(adapter, 128, 1000);
  run_at(restored, 128, 1000);
  const auto a = adapter.decide(100, 128, 100.0, 15);
  const auto b = restored.decide(100, 128, 100.0, 15);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->global_batch_size, b->global_batch_size);
  EXPECT_EQ(a->reason, b->reason);
  BatchAdapter other(32, 1e-3, LrScaling::kSqrt, 1);
  EXPECT_THROW(other.load_state(adapter.state()), Error);
}

TEST(BatchAdapter, AResumeKeepsTheLrRuleItStartedWith) {
  BatchAdapter by_gain(64, 1e-3, LrScaling::kSqrt, 1);
  EXPECT_EQ(by_gain.state().at("lr_rule"), "gain");
  BatchAdapter by_batch(64, 1e-3, LrScaling::kSqrt, 1, AdaptOptions().lr(AdaptLr::kBatch));
  try {
    by_batch.load_state(by_gain.state());
    FAIL() << "a gain run resumed under the batch rule";
  } catch (const OptionError& e) {
    EXPECT_EQ(e.option(), Option::kResume);
    EXPECT_STREQ(e.what(),
                 "--resume: the checkpoint's --adapt run moved its lr by the gain rule, this one "
                 "by the batch; resume with --adapt-lr gain");
  }
  // A checkpoint written before the rule was kept followed the gain.
  nlohmann::json older = by_gain.state();
  older.erase("lr_rule");
  EXPECT_NO_THROW(by_gain.load_state(older));
  EXPECT_THROW(by_batch.load_state(older), OptionError);
}

TEST(BatchAdapter, AnUncertainNoiseScaleKeepsTheBatch) {
  BatchAdapter adapter(64, 1e-3, LrScaling::kSqrt, 1);
  run_at(adapter, 64, 1000);
  run_at(adapter, 128, 1200);
  // The point estimate (5000) would grow to 128 (see above); its low end
  // (20) says 128 is worth 1200 x 84 / 148 = 681 against 1000.
  EXPECT_FALSE(adapter.decide(100, 64, 5000.0, 20, NoiseInterval{20, 9000}));
  const auto grown = adapter.decide(150, 64, 5000.0, 20, NoiseInterval{4000, 6000});
  ASSERT_TRUE(grown);
  EXPECT_EQ(grown->global_batch_size, 128);
  EXPECT_NE(grown->reason.find("likely 4000-6000"), std::string::npos) << grown->reason;
}

TEST(NoiseScaleEstimator, ItsIntervalHoldsTheEstimateAndNarrowsWithSteadyMeasurements) {
  NoiseScaleEstimator few;
  few.add(8, 3.0, 32, 1.5);
  few.add(8, 2.9, 32, 1.4);
  EXPECT_FALSE(few.interval()) << "two measurements say nothing of the spread";
  // |G|^2 = 1 and tr(Sigma) = 100 in expectation: |G_B|^2 = 1 + 100 / B.
  NoiseScaleEstimator steady;
  NoiseScaleEstimator noisy;
  for (int i = 0; i < 20; ++i) {
    const double wobble = (i % 2 == 0 ? 1 : -1);
    steady.add(10, 11.0 + 0.1 * wobble, 50, 3.0);
    noisy.add(10, 11.0 + 4.0 * wobble, 50, 3.0);
  }
  const auto s = steady.interval();
  const auto n = noisy.interval();
  ASSERT_TRUE(s && n);
  EXPECT_LE(s->low, 100.0);
  EXPECT_GE(s->high, 100.0);
  EXPECT_LT(s->high - s->low, n->high - n->low);
  NoiseScaleEstimator restored;
  restored.load_state(steady.state());
  EXPECT_EQ(restored.interval()->low, s->low) << "the window is part of the state";
}

TEST(BatchAdapter, BadOptionsAreRefusedNamingTheFlag) {
  const auto message = [](auto make) {
    try {
      make();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message([] { BatchAdapter(64, 1e-3, LrScaling::kSqrt, 1, AdaptOptions().every(0)); })
                .rfind("--adapt-every:", 0),
            0u);
  EXPECT_EQ(message([] {
              BatchAdapter(64, 1e-3, LrScaling::kSqrt, 1, AdaptOptions().max_global_batch(32));
            }).rfind("--adapt-max-batch:", 0),
            0u);
  EXPECT_EQ(message([] { BatchAdapter(63, 1e-3, LrScaling::kSqrt, 2); }).rfind("--adapt:", 0), 0u);
  EXPECT_EQ(message([] {
              BatchAdapter(64, 1e-3, LrScaling::kSqrt, 1, AdaptOptions().min_global_batch(65));
            }),
            "--adapt-min-batch: 65 must be a multiple of the world size 1 and at most the "
            "starting global batch 64");
  EXPECT_EQ(message([] {
              BatchAdapter(64, 1e-3, LrScaling::kSqrt, 2, AdaptOptions().min_global_batch(5));
            }).rfind("--adapt-min-batch: 5 must be a multiple of the world size 2", 0),
            0u);
  EXPECT_EQ(message([] { check_adapt_options(AdaptOptions().min_global_batch(-2)); }),
            "--adapt-min-batch: must be 0 (for the starting batch / 32) or more, got -2");
  // The options on their own, before any batch is known (a front end's early check).
  EXPECT_EQ(message([] { check_adapt_options(AdaptOptions().max_global_batch(-1)); }),
            "--adapt-max-batch: must be 0 (for 32 x the starting batch) or more, got -1");
  EXPECT_EQ(message([] { check_adapt_options(AdaptOptions().every(0)); }),
            "--adapt-every: must be at least 1 step, got 0");
  EXPECT_EQ(message([] { check_adapt_options(AdaptOptions().every(1).max_global_batch(0)); }), "");
  EXPECT_EQ(message([] { parse_adapt_lr("linear"); }),
            "--adapt-lr: must be gain or batch, got 'linear'");
  EXPECT_EQ(parse_adapt_lr("batch"), AdaptLr::kBatch);
  EXPECT_EQ(adapt_lr_name(parse_adapt_lr("gain")), "gain");
}

TEST(BatchChange, RoundTripsThroughJson) {
  BatchChange c;
  c.step = 150;
  c.global_batch_size = 128;
  c.micro_batch_size = 64;
  c.accumulation_steps = 2;
  c.lr = 0.0014;
  c.noise_scale = 812.5;
  c.reason = "why";
  const nlohmann::json j = to_json(c);
  for (const char* field : {"step", "global_batch_size", "micro_batch_size", "accumulation_steps",
                            "lr", "noise_scale"}) {
    EXPECT_TRUE(j.contains(field)) << field;
  }
  const BatchChange back = batch_change_from_json(j);
  EXPECT_EQ(back.step, 150);
  EXPECT_EQ(back.global_batch_size, 128);
  EXPECT_EQ(back.noise_scale, 812.5);
  BatchChange start = c;
  start.noise_scale.reset();
  EXPECT_TRUE(to_json(start).at("noise_scale").is_null());
}

TEST(NoiseScaleEstimator, ItsStateRoundTrips) {
  NoiseScaleEstimator a;
  a.add(8, 3.0, 32, 1.5);
  a.add(8, 2.5, 32, 1.2);
  NoiseScaleEstimator b;
  b.load_state(a.state());
  EXPECT_EQ(b.noise_scale(), a.noise_scale());
  EXPECT_EQ(b.measurements(), 2);
  a.add(8, 2.0, 32, 1.0);
  b.add(8, 2.0, 32, 1.0);
  EXPECT_EQ(b.noise_scale(), a.noise_scale());
}

}  // namespace
}  // namespace batchtune
