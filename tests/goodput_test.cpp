#include "batchtune/tuning/goodput.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

#include "batchtune/plan/plan.h"
#include "cli_runner.h"

namespace batchtune {
namespace {

std::vector<SweepRow> rows(const std::vector<std::pair<int64_t, double>>& curve) {
  std::vector<SweepRow> out;
  for (const auto& [batch, sps] : curve) {
    SweepRow r;
    r.batch_size = batch;
    r.samples_per_s = sps;
    out.push_back(r);
  }
  return out;
}

// A GPU-like curve: throughput rises and levels off at the largest fit, 32.
const std::vector<SweepRow> kRising =
    rows({{1, 100}, {2, 190}, {4, 360}, {8, 600}, {16, 800}, {32, 880}});

const GoodputCandidate& at_global(const std::vector<GoodputCandidate>& cs, int64_t global) {
  for (const auto& c : cs) {
    if (c.global_batch_size == global) return c;
  }
  ADD_FAILURE() << "no candidate " << global;
  return cs.front();
}

TEST(Goodput, EfficiencyIsPolluxs) {
  EXPECT_DOUBLE_EQ(statistical_efficiency(100, 32, 32), 1);
  EXPECT_DOUBLE_EQ(statistical_efficiency(100, 32, 132), 132.0 / 232);
  EXPECT_DOUBLE_EQ(statistical_efficiency(0, 4, 16), 0.25) << "no noise: B0/B";
  EXPECT_DOUBLE_EQ(statistical_efficiency(std::numeric_limits<double>::infinity(), 4, 16), 1);
}

TEST(Goodput, SmallNoiseScaleChoosesASmallerBatchThanLargeNoise) {
  const auto low = goodput_candidates(kRising, 20, 1);
  // 1: 100, 2: 190·21/22, 4: 360·21/24, 8: 600·21/28, 16: 800·21/36, 32: 880·21/52
  EXPECT_DOUBLE_EQ(at_global(low, 16).goodput, 800.0 * 21 / 36);
  EXPECT_DOUBLE_EQ(at_global(low, 8).goodput, 600.0 * 21 / 28);
  const GoodputChoice a = select_goodput(low, 20, 1);
  EXPECT_EQ(a.chosen.global_batch_size, 16);
  EXPECT_EQ(a.chosen.accumulation_steps, 1);
  EXPECT_NE(a.reason.find("global batch 16"), std::string::npos) << a.reason;
  EXPECT_NE(a.reason.find("fastest, global batch 32"), std::string::npos) << a.reason;

  // 16: 800·201/216 = 744.4, 32: 880·201/232 = 762.4, 64: 880·201/264 = 670.
  const GoodputChoice b = select_goodput(goodput_candidates(kRising, 200, 1), 200, 1);
  EXPECT_EQ(b.chosen.global_batch_size, 32);
  EXPECT_DOUBLE_EQ(b.chosen.goodput, 880.0 * 201 / 232);
}

TEST(Goodput, BatchesAboveTheLargestFitAccumulateTheFastestDividingMicroBatch) {
  const auto cs = goodput_candidates(kRising, 1000, 1);
  const GoodputCandidate& c = at_global(cs, 256);
  EXPECT_EQ(c.micro_batch_size, 32);
  EXPECT_EQ(c.accumulation_steps, 8);
  EXPECT_DOUBLE_EQ(c.samples_per_s, 880);
  EXPECT_DOUBLE_EQ(c.efficiency, 1001.0 / 1256);
  EXPECT_EQ(cs.back().global_batch_size, 32 * kGoodputMaxAccumulation);
  for (size_t i = 1; i < cs.size(); ++i) {
    EXPECT_LT(cs[i - 1].global_batch_size, cs[i].global_batch_size);
  }
}

TEST(Goodput, ACpuLikeCurveAccumulatesRatherThanRunALargerSlowerBatch) {
  // Fastest at 8; 16 fits but is slower than 8 accumulated twice.
  const auto cpu = rows({{1, 2000}, {2, 3600}, {4, 5700}, {8, 7200}, {16, 2000}, {32, 1300}});
  const auto cs = goodput_candidates(cpu, 1e6, 1);
  EXPECT_EQ(at_global(cs, 16).micro_batch_size, 8);
  EXPECT_EQ(at_global(cs, 16).accumulation_steps, 2);
  EXPECT_DOUBLE_EQ(at_global(cs, 16).samples_per_s, 7200);
}

/// A row timed with an interval, noisy or not.
SweepRow timed(int64_t batch, double median, double low, double high, bool noisy = false) {
  SweepRow r;
  r.batch_size = batch;
  r.samples_per_s = median;
  r.samples_per_s_ci.median = median;
  r.samples_per_s_ci.low = low;
  r.samples_per_s_ci.high = high;
  r.samples_per_s_ci.n = 10;
  r.samples_per_s_ci.level = 0.95;
  r.noisy = noisy;
  return r;
}

TEST(Goodput, RowsThatCannotTellFallBackToTheLargestDividingMicroBatchAndSaySo) {
  // Under load every row noisy (batch 2 at 7.2 samples/s, 64 at 106, 1 at
  // 630): global batch 64 was planned as micro-batch 1 x 64.
  const std::vector<SweepRow> loaded = {timed(1, 630, 90, 900, true), timed(2, 7.2, 3, 400, true),
                                        timed(64, 106, 50, 1200, true),
                                        timed(825, 1134, 300, 1500, true)};
  const auto cs = goodput_candidates(loaded, 1e6, 1);
  const GoodputCandidate& c = at_global(cs, 64);
  EXPECT_EQ(c.micro_batch_size, 64);
  EXPECT_EQ(c.accumulation_steps, 1);
  EXPECT_NE(c.micro_note.find("cannot tell batch 1's 630.0 samples/s"), std::string::npos)
      << c.micro_note;
  // Not noisy, but intervals that overlap: the larger still.
  const std::vector<SweepRow> close = {timed(32, 1000, 800, 1200), timed(64, 900, 850, 950)};
  const auto cc = goodput_candidates(close, 1e6, 32);
  EXPECT_EQ(at_global(cc, 64).micro_batch_size, 64);
  EXPECT_NE(at_global(cc, 64).micro_note.find("intervals overlap"), std::string::npos);
  const GoodputChoice chosen = select_goodput({at_global(cc, 64)}, 1e6, 32);
  EXPECT_NE(chosen.reason.find("the largest that divides 64"), std::string::npos)
      << chosen.reason;
  // Clearly faster (intervals apart, neither noisy): the smaller one, as measured.
  const std::vector<SweepRow> apart = {timed(8, 7200, 7000, 7400), timed(16, 2000, 1900, 2100)};
  const GoodputCandidate& a = at_global(goodput_candidates(apart, 1e6, 8), 16);
  EXPECT_EQ(a.micro_batch_size, 8);
  EXPECT_EQ(a.accumulation_steps, 2);
  EXPECT_TRUE(a.micro_note.empty()) << a.micro_note;
}

TEST(Goodput, ABaseBatchAboveTheLargestFitStartsThereAndTheDataCapsTheTop) {
  const auto cs = goodput_candidates(kRising, 50, 100, 1000);
  EXPECT_EQ(cs.front().global_batch_size, 100);
  EXPECT_EQ(cs.front().micro_batch_size, 4) << "the fastest row that divides 100";
  EXPECT_EQ(cs.front().accumulation_steps, 25);
  EXPECT_DOUBLE_EQ(cs.front().efficiency, 1);
  EXPECT_EQ(cs.back().global_batch_size, 512);
  const GoodputChoice c = select_goodput(cs, 50, 100);
  // 100: 360·1 = 360; 128: 880·150/178 = 741.6; 256: 880·150/306 = 431.4
  EXPECT_EQ(c.chosen.global_batch_size, 128);
}

TEST(Goodput, UnboundedNoiseIsThroughputWithTheSmallestOfEquals) {
  const double inf = std::numeric_limits<double>::infinity();
  const GoodputChoice c = select_goodput(goodput_candidates(kRising, inf, 1), inf, 1);
  EXPECT_EQ(c.chosen.global_batch_size, 32);
  EXPECT_DOUBLE_EQ(c.chosen.goodput, 880);
}

TEST(GoodputCli, TuneMeasuresTheNoiseScaleAndChoosesTheGlobalBatch) {
  const auto r = testing::run_cli(
      "tune --objective goodput --data fashion-mnist --model mlp --device cpu --amp off "
      "--max-batch 8 --noise-steps 20 --memory-limit 256MiB --json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto json = nlohmann::json::parse(r.output.substr(r.output.find("\n{") + 1));
  EXPECT_EQ(json.at("objective"), "goodput");
  ASSERT_TRUE(json.at("noise_scale").is_number()) << json.dump(2);
  EXPECT_GT(json.at("noise_scale").get<double>(), 0);
  EXPECT_EQ(json.at("noise_scale_run").at("measurements"), 20);
  EXPECT_EQ(json.at("noise_scale_run").at("small_batch"), 8) << "at least 8 where it fits";
  const auto& goodput = json.at("goodput");
  ASSERT_FALSE(goodput.empty());
  const int64_t base = json.at("goodput_base_batch");
  const double noise = json.at("noise_scale");
  double best = 0;
  for (const auto& c : goodput) {
    const int64_t global = c.at("global_batch_size");
    EXPECT_EQ(global, c.at("micro_batch_size").get<int64_t>() *
                          c.at("accumulation_steps").get<int64_t>());
    EXPECT_NEAR(c.at("efficiency").get<double>(), (noise + base) / (noise + global), 1e-9);
    EXPECT_NEAR(c.at("goodput").get<double>(),
                c.at("samples_per_s").get<double>() * c.at("efficiency").get<double>(), 1e-6);
    best = std::max(best, c.at("goodput").get<double>());
  }
  const int64_t chosen = json.at("goodput_global_batch_size");
  const auto& plan = json.at("plan");
  EXPECT_EQ(plan.at("global_batch_size"), chosen);
  EXPECT_EQ(plan.at("micro_batch_size"), json.at("chosen_batch_size"));
  for (const auto& c : goodput) {
    if (c.at("global_batch_size") == chosen) EXPECT_DOUBLE_EQ(c.at("goodput").get<double>(), best);
  }
  EXPECT_NE(r.output.find("noise scale"), std::string::npos) << r.output;
  EXPECT_NE(json.at("reason").get<std::string>().find("goodput:"), std::string::npos);
}

TEST(GoodputCli, TheDefaultObjectiveIsGoodputOnImagesAndThroughputWithATargetBatch) {
  const std::string tune =
      "tune --data fashion-mnist --model mlp --device cpu --amp off --max-batch 8 "
      "--noise-steps 10 --memory-limit 256MiB --time-budget 10 --json - ";
  const auto goodput = testing::run_cli(tune);
  ASSERT_EQ(goodput.exit_code, 0) << goodput.output;
  const auto g = nlohmann::json::parse(goodput.output.substr(goodput.output.find("\n{") + 1));
  EXPECT_EQ(g.at("objective"), "goodput");
  EXPECT_EQ(g.at("goodput_base_batch"), kDefaultBaseBatch) << "the batch the default lr is for";
  // A global batch asked for leaves goodput nothing to choose.
  const auto throughput = testing::run_cli(tune + "--target-batch 64");
  ASSERT_EQ(throughput.exit_code, 0) << throughput.output;
  const auto t =
      nlohmann::json::parse(throughput.output.substr(throughput.output.find("\n{") + 1));
  EXPECT_EQ(t.at("objective"), "throughput");
  EXPECT_EQ(t.at("plan").at("global_batch_size"), 64);
}

TEST(GoodputCli, TargetBatchConflictsWithGoodput) {
  const auto r = testing::run_cli(
      "tune --objective goodput --model mlp --input 1x8x8 --device cpu --target-batch 64");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--target-batch"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace batchtune
