#include "batchtune/tuning/token_budget.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "batchtune/common/error.h"
#include "batchtune/data/token_batches.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/plan/plan.h"
#include "batchtune/reports/tune_report.h"
#include "batchtune/step/trial.h"
#include "batchtune/step/workload.h"
#include "batchtune/tuning/search.h"
#include "batchtune/tuning/tune.h"
#include "test_helpers.h"

namespace batchtune {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

/// A made-up peak: fixed + per_token·b·L + quadratic·b·L².
struct Curve {
  double fixed = 0;
  double per_token = 0;
  double quadratic = 0;
  double per_sample = 0;  ///< a term the model does not have: bytes per sample
  int64_t operator()(int64_t b, int64_t l) const {
    const double tokens = static_cast<double>(b * l);
    return static_cast<int64_t>(fixed + per_token * tokens + quadratic * tokens * static_cast<double>(l) +
                                per_sample * static_cast<double>(b));
  }
};

/// Trials of a curve under `usable` bytes: over it is an over-budget failure
/// with its peak, as a real trial reports it.
TrialResult curve_trial(const Curve& curve, int64_t usable, int64_t b, int64_t l) {
  TrialResult t;
  t.batch_size = b;
  t.sequence_length = l;
  t.peak_bytes = curve(b, l);
  t.fits = t.peak_bytes <= usable;
  t.failure = t.fits ? TrialFailure::kNone : TrialFailure::kOverBudget;
  return t;
}

/// What a search at the longest length leaves: fits up to `max_fit`.
std::vector<TrialResult> searched(const Curve& curve, int64_t usable, int64_t length,
                                  std::vector<int64_t> batches) {
  std::vector<TrialResult> trials;
  for (int64_t b : batches) trials.push_back(curve_trial(curve, usable, b, length));
  return trials;
}

TEST(MemoryModel, ALinearCurveFitsLinearlyAndExactly) {
  const Curve curve{10e6, 5000, 0, 0};
  std::vector<MemoryPoint> points;
  for (auto [b, l] : {std::pair<int64_t, int64_t>{8, 512}, {16, 512}, {128, 32}, {256, 16}}) {
    points.push_back({b, l, curve(b, l)});
  }
  const MemoryModel m = fit_memory_model(points);
  EXPECT_FALSE(m.quadratic);
  EXPECT_NEAR(m.fixed_bytes, 10e6, 1e3);
  EXPECT_NEAR(m.per_token_bytes, 5000, 0.5);
  EXPECT_LT(m.fit_error, 1e-4);
  EXPECT_NEAR(m.fitted_quadratic_bytes, 0, 1e-2) << "the full fit finds no quadratic term";
  // 100 MiB usable: (100 MiB − 10 MB) / 5000 tokens.
  const int64_t usable = 100 * kMiB;
  const auto expected = static_cast<int64_t>((static_cast<double>(usable) - 10e6) / 5000);
  EXPECT_NEAR(static_cast<double>(m.token_budget(512, usable)), static_cast<double>(expected), 1);
  EXPECT_NEAR(static_cast<double>(m.max_batch(512, usable)), static_cast<double>(expected / 512), 1);
}

TEST(MemoryModel, AnAttentionMatrixNeedsTheQuadraticTerm) {
  const Curve curve{10e6, 4000, 40, 0};  // at 512 tokens the quadratic part is 5x the linear
  std::vector<MemoryPoint> points;
  for (auto [b, l] : {std::pair<int64_t, int64_t>{8, 512}, {16, 512}, {64, 64}, {128, 64},
                      {256, 16}, {512, 16}}) {
    points.push_back({b, l, curve(b, l)});
  }
  const MemoryModel m = fit_memory_model(points);
  EXPECT_TRUE(m.quadratic) << "linear error " << m.linear_fit_error;
  EXPECT_GT(m.linear_fit_error, kLinearFitTolerance);
  EXPECT_NEAR(m.per_token_length_bytes, 40, 0.01);
  EXPECT_LT(m.fit_error, 1e-4);
  // The budget holds at the longest length, where tokens cost the most.
  const int64_t usable = 200 * kMiB;
  const int64_t budget = m.token_budget(512, usable);
  EXPECT_LE(curve(budget / 512, 512), usable);
  EXPECT_LE(curve(budget / 16, 16), usable);
  EXPECT_GT(curve(budget / 512 + 2, 512), usable * 99 / 100) << "and it is not far below";
}

TEST(MemoryModel, NeedsTwoTokenCounts) {
  EXPECT_THROW(fit_memory_model({{4, 128, 1000}}), Error);
  EXPECT_THROW(fit_memory_model({{4, 128, 1000}, {8, 64, 1000}}), Error);  // 512 tokens twice
}

TEST(LengthBuckets, PowersOfTwoFromTheShortestToTheLongest) {
  EXPECT_EQ(length_bucket_bounds({16, 512}), (std::vector<int64_t>{16, 32, 64, 128, 256, 512}));
  EXPECT_EQ(length_bucket_bounds({10, 100}), (std::vector<int64_t>{10, 16, 32, 64, 100}));
  EXPECT_EQ(length_bucket_bounds({1, 3}), (std::vector<int64_t>{1, 2, 3}));
}

TEST(TokenBudget, PlansABudgetThatFitsAtEveryLengthAndChecksTheExtremes) {
  const Curve curve{8e6, 3000, 0, 0};
  const int64_t usable = 64 * kMiB;
  // The search at 512 found 38 (39 is over).
  const auto search = searched(curve, usable, 512, {2, 16, 38, 39});
  ASSERT_TRUE(search[2].fits);
  ASSERT_FALSE(search[3].fits);
  std::vector<std::pair<int64_t, int64_t>> asked;
  const TokenBudgetResult r = plan_token_budget(
      [&](int64_t b, int64_t l) {
        asked.emplace_back(b, l);
        return curve_trial(curve, usable, b, l);
      },
      search, 38, {16, 512}, usable, 1 << 20);
  EXPECT_FALSE(r.model.quadratic);
  // Every bucket's micro-batch at its bound fits the curve, and the budget too.
  ASSERT_EQ(r.buckets.size(), 6u);
  for (const auto& b : r.buckets) {
    EXPECT_LE(curve(b.micro_batch_size, b.max_length), usable) << b.max_length;
    EXPECT_LE(b.micro_batch_size * b.max_length, r.token_budget);
  }
  EXPECT_EQ(r.buckets.back().micro_batch_size, 38) << "the search's own largest at the longest";
  EXPECT_GT(r.buckets.front().micro_batch_size, 38 * 512 / 16 * 9 / 10) << "about 32x at 16";
  check_length_buckets(r.token_budget, r.buckets, "test");  // a valid plan field
  // Measured at shorter lengths, then checked with real trials at both ends.
  bool at_shortest = false;
  for (auto [b, l] : asked) at_shortest = at_shortest || (l == 16);
  EXPECT_TRUE(at_shortest);
  ASSERT_EQ(r.checks.size(), 2u);
  EXPECT_EQ(r.checks[0].length, 16);
  EXPECT_EQ(r.checks[1].length, 512);
  for (const auto& c : r.checks) {
    EXPECT_TRUE(c.fits);
    EXPECT_NEAR(c.predicted_bytes, static_cast<double>(c.measured_bytes),
                0.01 * static_cast<double>(c.measured_bytes));
  }
  EXPECT_NE(r.reason.find("linear in tokens"), std::string::npos) << r.reason;
}

TEST(TokenBudget, AFailedCheckAtTheShortestShrinksTheBudget) {
  // Bytes per sample the model does not know of: at 16 tokens, 32x the
  // samples cost more than the longest's fit.
  const Curve curve{8e6, 3000, 0, 120000};
  const int64_t usable = 64 * kMiB;
  int64_t max_fit = 1;
  while (curve(max_fit + 1, 512) <= usable) ++max_fit;
  const auto search = searched(curve, usable, 512, {2, 16, max_fit, max_fit + 1});
  const TokenBudgetResult r = plan_token_budget(
      [&](int64_t b, int64_t l) { return curve_trial(curve, usable, b, l); }, search, max_fit,
      {16, 512}, usable, 1 << 20);
  EXPECT_LE(curve(r.buckets.front().micro_batch_size, 16), usable)
      << "the shortest bucket fits after shrinking: " << r.reason;
  for (const auto& c : r.checks) EXPECT_TRUE(c.fits) << c.batch_size << " x " << c.length;
}

// ---- the real step: gpt on the CPU under an emulated budget ----

WorkloadOptions tiny_gpt(const std::string& input) {
  return WorkloadOptions()
      .model("gpt")
      .input_spec(parse_input_flags(InputFlags().inputs({input}).vocab(256)))
      .gpt(GptOptions().layers(1).heads(2).width(32))
      .seed(3);
}

TEST(TokenBudget, GptPredictionsAtTheLongestLengthAreWithinTenPercentOfMeasuredPeaks) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 24 * kMiB);
  Workload workload(tiny_gpt("int64:16..128"));
  TrialRunner runner(workload, *memory, kDefaultMargin);
  const auto run = [&](int64_t b, int64_t l) {
    return runner.run(TrialOptions().batch_size(b).sequence_length(l).steps(1).warmup_steps(1));
  };
  const SearchResult search = search_max_batch(
      [&](int64_t b) { return run(b, 0); }, SearchOptions().max_batch(4096).time_budget_s(60),
      steady_clock());
  ASSERT_GE(search.max_batch_size, 4);
  for (const auto& t : search.trials) EXPECT_EQ(t.sequence_length, 128) << "the longest";
  const TokenBudgetResult r = plan_token_budget(run, search.trials, search.max_batch_size,
                                                {16, 128}, memory->usable_bytes(), 4096);
  // Whether the fused attention kernel keeps it linear is measured, not assumed.
  std::cout << "gpt memory model: fixed " << r.model.fixed_bytes << " B, "
            << r.model.per_token_bytes << " B/token, fitted quadratic "
            << r.model.fitted_quadratic_bytes << " B, quadratic kept " << r.model.quadratic
            << ", linear error " << r.model.linear_fit_error << "\n";
  // Predictions at the longest length against peaks the fit never saw.
  constexpr double kTolerance = 0.10;
  for (int64_t b : {search.max_batch_size / 2, search.max_batch_size * 3 / 4}) {
    const TrialResult t = run(b, 128);
    ASSERT_TRUE(t.fits) << b;
    const double predicted = r.model.predict(b, 128);
    EXPECT_NEAR(predicted, static_cast<double>(t.peak_bytes),
                kTolerance * static_cast<double>(t.peak_bytes))
        << "batch " << b;
  }
  // The checks at both ends were real trials that fitted.
  ASSERT_EQ(r.checks.size(), 2u);
  for (const auto& c : r.checks) {
    EXPECT_TRUE(c.fits) << c.batch_size << " x " << c.length;
    EXPECT_NEAR(c.predicted_bytes, static_cast<double>(c.measured_bytes),
                kTolerance * static_cast<double>(c.measured_bytes));
  }
  EXPECT_GT(r.buckets.front().micro_batch_size, r.buckets.back().micro_batch_size * 4)
      << "short sequences take many more samples per micro-batch";
}

TEST(TokenBudget, ARangeSpecTuneMeasuresAtTheLongestLengthAndPlansTheBudget) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 24 * kMiB);
  Workload ranged(tiny_gpt("int64:16..128"));
  Workload fixed(tiny_gpt("int64:128"));  // made first: both are resident in every trial
  const TuneOptions options = TuneOptions().amp(AmpMode::kOff).time_budget_s(5).search(
      SearchOptions().max_batch(4096));
  const TuneResult r = tune(ranged, *memory, options);
  ASSERT_FALSE(r.search.trials.empty());
  for (const auto& t : r.search.trials) EXPECT_EQ(t.sequence_length, 128) << t.batch_size;
  // The same trials as for a fixed spec of the longest length: the same peaks.
  TrialRunner fixed_runner(fixed, *memory, kDefaultMargin);
  for (size_t i = 0; i < 2 && i < r.search.trials.size(); ++i) {
    const TrialResult& t = r.search.trials[i];
    const TrialResult same = fixed_runner.run(
        TrialOptions().batch_size(t.batch_size).steps(1).warmup_steps(1));
    EXPECT_EQ(same.peak_bytes, t.peak_bytes) << "batch " << t.batch_size;
  }
  ASSERT_TRUE(r.tokens.has_value());
  ASSERT_TRUE(r.plan.has_value());
  EXPECT_EQ(r.plan->token_budget, r.tokens->token_budget);
  // Near the search's own fit at the longest (less room kept for the
  // gradients of accumulation), and never more samples there than it fitted.
  EXPECT_GT(r.plan->token_budget, r.search.max_batch_size * 128 * 8 / 10);
  EXPECT_LE(r.plan->length_buckets.back().micro_batch_size, r.search.max_batch_size);
  ASSERT_EQ(r.plan->length_buckets.size(), 4u);  // 16, 32, 64, 128
  EXPECT_EQ(r.plan->length_buckets.back().max_length, 128);
  EXPECT_FALSE(r.plan->reason(PlanField::kTokenBudget).empty());
  for (const auto& row : r.sweep) {
    EXPECT_NEAR(row.tokens_per_s, row.samples_per_s * 128, 1e-6 * row.tokens_per_s);
  }
  // The reports: JSON `tokens` and `tokens_per_s`, the page's length phase and tokens/s column.
  const nlohmann::json json = to_json(r);
  ASSERT_TRUE(json.contains("tokens"));
  EXPECT_EQ(json["tokens"]["token_budget"], r.plan->token_budget);
  EXPECT_EQ(json["plan"]["token_budget"], r.plan->token_budget);
  ASSERT_FALSE(json["sweep"].empty());
  EXPECT_GT(json["sweep"][0]["tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(json["trials"][0]["sequence_length"], 128);
  const std::string page = html_report(r);
  EXPECT_NE(page.find("<th>tokens/s</th>"), std::string::npos);
  EXPECT_NE(page.find("Lengths 16..128: token budget"), std::string::npos);
}

TEST(TokenBudget, TheLrBelongsToTheSamplesAStepHoldsAtTheDataMeanLength) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 24 * kMiB);
  Workload ranged(tiny_gpt("int64:16..128"));
  PlanRequest request;
  request.base_lr = 1e-3;
  request.base_batch = 8;
  request.mean_length = 32.0;
  const TuneResult r = tune(ranged, *memory,
                            TuneOptions().amp(AmpMode::kOff).time_budget_s(5).plan(request));
  ASSERT_TRUE(r.plan.has_value());
  const Plan& plan = *r.plan;
  ASSERT_GT(plan.token_budget, 0);
  EXPECT_EQ(plan.tokens_per_step, plan.token_budget) << "one budget a process by default";
  // A step of the budget's real tokens holds budget / mean samples, and the
  // lr (sqrt for Adam) is scaled from batch 8 to about them.
  const double samples = static_cast<double>(plan.tokens_per_step) / 32.0;
  EXPECT_NEAR(static_cast<double>(plan.global_batch_size), samples, 0.5 * samples);
  EXPECT_NEAR(plan.lr, 1e-3 * std::sqrt(static_cast<double>(plan.global_batch_size) / 8), 1e-12);
  EXPECT_NE(plan.reason(PlanField::kGlobalBatch).find("mean length 32.0"), std::string::npos)
      << plan.reason(PlanField::kGlobalBatch);

  // A target batch in samples sets the tokens of a step at the mean length.
  request.target_batch = 10;
  const TuneResult t = tune(ranged, *memory,
                            TuneOptions().amp(AmpMode::kOff).time_budget_s(5).plan(request));
  ASSERT_TRUE(t.plan.has_value());
  EXPECT_EQ(t.plan->tokens_per_step, 320);
}

TEST(TokenBatches, BucketsAreCutAtTheDataQuantilesWithinTheBudget) {
  const std::vector<LengthBucket> plan{{16, 64}, {32, 32}, {64, 16}};
  // Most samples between 17 and 32: quantile bounds fall there.
  std::vector<int64_t> lengths;
  for (int64_t l = 17; l <= 32; ++l) lengths.insert(lengths.end(), 4, l);
  lengths.push_back(64);
  const auto buckets = buckets_for_lengths(plan, 1024, lengths, 4);
  std::vector<int64_t> bounds;
  for (const auto& b : buckets) bounds.push_back(b.max_length);
  EXPECT_EQ(bounds, (std::vector<int64_t>{16, 21, 25, 29, 32, 64}));
  for (const auto& b : buckets) EXPECT_LE(b.micro_batch_size * b.max_length, 1024) << b.max_length;
  EXPECT_EQ(buckets[1].micro_batch_size, 48) << "the budget's 1024 / 21, below the 64 at 16";
  EXPECT_EQ(buckets.back().micro_batch_size, 16) << "the plan's own buckets stay";
  // The micro-batches a sampler cuts by them pad less than by the plan's.
  const auto padded = [&](const std::vector<LengthBucket>& bs) {
    int64_t p = 0;
    for (const auto& b : LengthBucketSampler(lengths, bs, 1024, 0).epoch(0)) p += b.padded_tokens;
    return p;
  };
  EXPECT_LT(padded(buckets), padded(plan));
  EXPECT_EQ(buckets_for_lengths(plan, 1024, {}, 4).size(), plan.size());
}

TEST(TokenSteps, StepsTakeWholeRoundsUntilTheirRealTokensReachTheTarget) {
  const auto batch = [](int64_t tokens) { return TokenBatch{{0}, tokens, tokens}; };
  // One rank: 60 + 50 reach 100; 30 + 30 + 40; 10 is what is left.
  EXPECT_EQ(steps_by_tokens({batch(60), batch(50), batch(30), batch(30), batch(40), batch(10)},
                            100, 1),
            (std::vector<int64_t>{2, 3, 1}));
  // Two ranks: the rounds' tokens over both ranks count, the same steps for both.
  EXPECT_EQ(steps_by_tokens({batch(60), batch(50), batch(30), batch(30), batch(40), batch(10)},
                            100, 2),
            (std::vector<int64_t>{1, 2}));
  EXPECT_THROW(steps_by_tokens({batch(1), batch(2), batch(3)}, 100, 2), Error);
  EXPECT_THROW(steps_by_tokens({batch(1)}, 0, 1), Error);
  EXPECT_DOUBLE_EQ(mean_length({16, 32, 48}), 32.0);
  EXPECT_DOUBLE_EQ(mean_length({}), 0.0);
}

}  // namespace
}  // namespace batchtune
