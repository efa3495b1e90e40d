#include "batchtune/tuning/tune.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/reports/tune_page.h"
#include "batchtune/reports/tune_report.h"
#include "batchtune/step/training_step.h"
#include "batchtune/step/workload.h"
#include "batchtune/training/trainer.h"
#include "fake_clock.h"
#include "test_helpers.h"

namespace batchtune {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

/// A subject whose step holds `bytes_per_sample` × batch of device memory:
/// a made-up memory curve that fails with a real out-of-memory under the
/// CPU budget, and takes no time.
class FakeSubject final : public TrialSubject {
 public:
  /// `forward_only_bytes_per_sample`: what a forward-only step holds; 0 for
  /// a subject without one.
  explicit FakeSubject(int64_t bytes_per_sample, int64_t forward_only_bytes_per_sample = 0)
      : bytes_per_sample_(bytes_per_sample),
        forward_only_bytes_per_sample_(forward_only_bytes_per_sample) {}
  std::string describe() const override { return "fake"; }
  void save() override { ++saves; }
  void prepare(int64_t batch_size) override { batch_size_ = batch_size; }
  at::Tensor step() override {
    ++steps;
    // Held while the loss is made, as activations are (never touched: the
    // budget counts the allocation, and the step takes no time).
    const at::Tensor activations = at::empty(
        {batch_size_ * (forward_only_ ? forward_only_bytes_per_sample_ : bytes_per_sample_)},
        at::TensorOptions().dtype(at::kByte));
    (void)activations;
    return at::ones({});
  }
  void restore() override { ++restores; }
  bool set_forward_only(bool on) override {
    if (forward_only_bytes_per_sample_ == 0) return !on;
    forward_only_ = on;
    return true;
  }

  int saves = 0;
  int restores = 0;
  int64_t steps = 0;
  bool forward_only_ = false;

 private:
  int64_t bytes_per_sample_;
  int64_t forward_only_bytes_per_sample_;
  int64_t batch_size_ = 0;
};

/// Records what the pipeline reported.
class Recorder final : public TuneReporter {
 public:
  void phase_started(TunePhase phase, const std::string&) override { phases.push_back(phase); }
  void trial_finished(TunePhase, const TrialResult& trial, size_t) override {
    trials.push_back(trial);
  }
  void finished(const TuneResult& result) override { complete = result.complete; }

  std::vector<TunePhase> phases;
  std::vector<TrialResult> trials;
  std::optional<bool> complete;
};

TEST(QuickTune, OnRealDataWithAFreeGlobalBatchItTunesForGoodputElseForThroughput) {
  // `train` without a batch size trains the plan `tune --data` would give:
  // goodput on real data (the noise run and loader tuning on it).
  const auto real = testing::toy_data({4}, 64, 2, 0);
  const TuneOptions on_data = quick_tune_options(PlanRequest{}, 64, real.get());
  EXPECT_EQ(on_data.objective(), Objective::kGoodput);
  EXPECT_EQ(on_data.data(), real.get());
  EXPECT_EQ(on_data.search().max_batch(), 64);
  // Made-up samples measure no noise: throughput, and no data.
  const SyntheticDataset synthetic({4}, 2, 64, 0);
  const TuneOptions made_up = quick_tune_options(PlanRequest{}, 64, &synthetic);
  EXPECT_EQ(made_up.objective(), Objective::kThroughput);
  EXPECT_EQ(made_up.data(), nullptr);
  EXPECT_EQ(quick_tune_options(PlanRequest{}, 64).objective(), Objective::kThroughput);
  // A global batch asked for leaves goodput nothing to choose.
  PlanRequest fixed;
  fixed.target_batch = 256;
  EXPECT_EQ(quick_tune_options(fixed, 64, real.get()).objective(), Objective::kThroughput);
  // `resolve_plan` hands back the quick tune's sweep; given a micro-batch, none ran.
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 << 20);
  Workload workload(WorkloadOptions().model("mlp").input_shape({4}).classes(2));
  PlanRequest given;
  given.micro_batch_size = 8;
  given.amp = AmpMode::kOff;
  std::vector<SweepRow> sweep{SweepRow{}};
  const Plan plan = resolve_plan(given, workload, *memory, 64, nullptr, nullptr, nullptr,
                                 real.get(), &sweep);
  EXPECT_EQ(plan.micro_batch_size, 8);
  EXPECT_TRUE(sweep.empty());
}

TEST(Tune, FindsTheLimitOfAFakeCurveAndPlansIt) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  FakeSubject subject(64 * 1024);  // 64 KiB a sample: ~900 fit in 57.6 MiB usable
  TrialRunner runner(subject, *memory, 0.1);
  PlanRequest request;
  request.target_batch = 4096;
  Recorder recorder;
  const TuneResult r =
      tune(runner, TuneOptions().time_budget_s(60).plan(request), &recorder);
  ASSERT_TRUE(r.complete);
  const int64_t limit = r.usable_bytes / (64 * 1024);
  EXPECT_LE(r.search.max_batch_size, limit);
  EXPECT_GE(r.search.max_batch_size, limit * 95 / 100) << r.search.stop_reason;
  ASSERT_TRUE(r.plan.has_value());
  EXPECT_LE(r.plan->micro_batch_size, r.search.max_batch_size);
  EXPECT_EQ(r.plan->global_batch_size % r.plan->micro_batch_size, 0);
  EXPECT_EQ(r.plan->amp, AmpMode::kOff);
  EXPECT_EQ(subject.saves, subject.restores) << "every trial put back";
  EXPECT_EQ(recorder.complete, std::optional<bool>(true));
  ASSERT_GE(recorder.phases.size(), 2U);
  EXPECT_EQ(recorder.phases[0], TunePhase::kSearch);
  EXPECT_EQ(recorder.phases[1], TunePhase::kSweep);
  // The JSON is the CLI's, plan and loader included.
  const nlohmann::json json = to_json(r);
  EXPECT_EQ(json.at("complete"), true);
  EXPECT_EQ(json.at("plan").at("micro_batch_size"), r.plan->micro_batch_size);
  EXPECT_EQ(json.at("amp"), "off");
  EXPECT_TRUE(json.contains("loader_note"));
  EXPECT_EQ(json.at("trials").size(), r.search.trials.size());
}

TEST(Tune, AForwardOnlySearchGivesThePlanItsEvaluationBatch) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  // Training holds 64 KiB a sample, evaluation a quarter of it.
  FakeSubject subject(64 * 1024, 16 * 1024);
  TrialRunner runner(subject, *memory, 0.1);
  Recorder recorder;
  const TuneResult r = tune(runner, TuneOptions().time_budget_s(60), &recorder);
  ASSERT_TRUE(r.eval_search.has_value());
  ASSERT_TRUE(r.plan.has_value());
  const int64_t limit = r.usable_bytes / (16 * 1024);
  EXPECT_LE(r.eval_search->max_batch_size, limit);
  EXPECT_GE(r.eval_search->max_batch_size, limit * 95 / 100) << r.eval_search->stop_reason;
  EXPECT_GT(r.eval_search->max_batch_size, 3 * r.search.max_batch_size);
  EXPECT_EQ(r.plan->eval_micro_batch_size, r.eval_search->max_batch_size);
  EXPECT_NE(r.plan->reason(PlanField::kEvalBatch).find("forward-only"), std::string::npos);
  EXPECT_FALSE(subject.forward_only_) << "training steps again after the tune";
  EXPECT_EQ(subject.saves, subject.restores);
  EXPECT_NE(std::find(recorder.phases.begin(), recorder.phases.end(), TunePhase::kEval),
            recorder.phases.end());
  const nlohmann::json json = to_json(r);
  EXPECT_EQ(json.at("eval_search").at("max_batch_size"), r.eval_search->max_batch_size);
  EXPECT_EQ(json.at("plan").at("eval_micro_batch_size"), r.plan->eval_micro_batch_size);
  EXPECT_TRUE(json.at("phase_seconds").contains("eval"));

  // A subject without a forward-only step: no evaluation batch, and said so.
  FakeSubject train_only(64 * 1024);
  TrialRunner train_runner(train_only, *memory, 0.1);
  const TuneResult none = tune(train_runner, TuneOptions().time_budget_s(60));
  EXPECT_FALSE(none.eval_search.has_value());
  ASSERT_TRUE(none.plan.has_value());
  EXPECT_EQ(none.plan->eval_micro_batch_size, 0);
  EXPECT_TRUE(to_json(none).at("eval_search").is_null());
}

TEST(Tune, AForwardOnlyTrialOfAWorkloadKeepsNoGradientsAndLeavesTrainMode) {
  // ResNet-18 has batch norm: eval mode changes its loss.
  Workload workload(WorkloadOptions().model("resnet18").input_shape({3, 32, 32}));
  auto memory = make_device_memory(c10::Device(c10::kCPU), 1024 * kMiB);
  TrialRunner runner(workload, *memory);
  const TrialResult train = runner.run(TrialOptions().batch_size(8));
  TrialResult eval;
  {
    ForwardOnlyScope forward_only(runner.subject());
    ASSERT_TRUE(forward_only.supported());
    eval = runner.run(TrialOptions().batch_size(8));
  }
  ASSERT_TRUE(train.fits && eval.fits);
  EXPECT_LT(eval.peak_bytes, train.peak_bytes / 2) << "no activations kept for a backward";
  for (const auto& p : workload.model().parameters()) EXPECT_FALSE(p.grad().defined());
  // Training steps again afterwards, in train mode (batch norm's batch
  // statistics: the same loss as before, which eval mode would not give).
  const TrialResult again = runner.run(TrialOptions().batch_size(8));
  EXPECT_NEAR(again.loss, train.loss, 1e-5 * std::abs(train.loss));
  EXPECT_GT(std::abs(eval.loss - train.loss), 1e-3 * std::abs(train.loss))
      << "eval mode: batch norm's running statistics";
}

TEST(Tune, ARunnerTunePlansWithTheRequestedOptimizersLrScaling) {
  // A subject without a Workload (the Python package's): the plan's default
  // lr scaling follows the optimizer the request names.
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  FakeSubject subject(64 * 1024);
  TrialRunner runner(subject, *memory, 0.1);
  PlanRequest request;
  request.target_batch = 4096;
  request.base_batch = 256;  // the batch the lr belongs to: scaled from there
  const TuneResult adam = tune(runner, TuneOptions().time_budget_s(60).plan(request));
  ASSERT_TRUE(adam.plan.has_value());
  EXPECT_EQ(adam.plan->lr_scaling, LrScaling::kSqrt);
  request.optimizer = "sgd";
  const TuneResult sgd = tune(runner, TuneOptions().time_budget_s(60).plan(request));
  ASSERT_TRUE(sgd.plan.has_value());
  EXPECT_EQ(sgd.plan->lr_scaling, LrScaling::kLinear);
  EXPECT_NE(sgd.plan->reason(PlanField::kLr).find("default for sgd"), std::string::npos)
      << sgd.plan->reason(PlanField::kLr);
}

TEST(Tune, MeasuredCpuAmpOverRunnersSaysWhenFp32DoesNotFit) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 16 * kMiB);
  FakeSubject subject(16 * kMiB);  // not even one sample fits
  TrialRunner fp32(subject, *memory, 0.1);
  TrialRunner bf16(subject, *memory, 0.1);
  AmpMeasureOptions options;
  options.max_batch = 4;
  const AmpChoice choice = measure_cpu_amp(fp32, bf16, options);
  EXPECT_EQ(choice.mode, AmpMode::kOff);
  // Halved from 4 down to 1 before it gave up.
  EXPECT_NE(choice.reason.find("fp32 step at batch 1 did not fit"), std::string::npos)
      << choice.reason;
  EXPECT_EQ(subject.saves, subject.restores);
}

TEST(Tune, AStopEndsTheRunIncompleteWithTheTrialsSoFar) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  FakeSubject subject(64 * 1024);
  TrialRunner runner(subject, *memory, 0.1);
  int asked = 0;
  const TuneResult r = tune(runner, TuneOptions().stop([&]() -> std::optional<std::string> {
    // Three trials run; the fourth is refused.
    if (++asked > 3) return std::string("test stop");
    return std::nullopt;
  }));
  EXPECT_FALSE(r.complete);
  EXPECT_EQ(r.interrupted_by, "test stop");
  EXPECT_EQ(r.search.trials.size(), 3U);
  EXPECT_EQ(r.search.stop_reason, "interrupted by test stop");
  EXPECT_FALSE(r.plan.has_value());
  EXPECT_GT(r.search.max_batch_size, 0) << "the largest that fitted so far";
  EXPECT_EQ(subject.saves, subject.restores);
  const nlohmann::json json = to_json(r);
  EXPECT_EQ(json.at("complete"), false);
  EXPECT_EQ(json.at("interrupted_by"), "test stop");
}

TEST(Tune, AStopDuringTheSweepKeepsTheRowsTimed) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  FakeSubject subject(64 * 1024);
  TrialRunner runner(subject, *memory, 0.1);
  TunePhase phase = TunePhase::kSearch;
  int sweep_trials = 0;
  class PhaseWatch final : public TuneReporter {
   public:
    explicit PhaseWatch(TunePhase& phase) : phase_(phase) {}
    void phase_started(TunePhase p, const std::string&) override { phase_ = p; }

   private:
    TunePhase& phase_;
  } watch(phase);
  const TuneResult r = tune(runner, TuneOptions().stop([&]() -> std::optional<std::string> {
    if (phase == TunePhase::kSweep && ++sweep_trials > 2) return std::string("SIGINT");
    return std::nullopt;
  }), &watch);
  EXPECT_FALSE(r.complete);
  EXPECT_GT(r.search.max_batch_size, 0);
  EXPECT_FALSE(r.sweep.empty()) << "the sweep rows timed before the stop";
}

TEST(Tune, NotEvenBatchOneFittingIsAnErrorSayingWhatWasNeeded) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 1 * kMiB);
  FakeSubject subject(4 * kMiB);
  TrialRunner runner(subject, *memory, 0.1);
  const std::string message = testing::error_of([&] { tune(runner, TuneOptions()); });
  EXPECT_NE(message.find("not even batch 1 fits"), std::string::npos) << message;
}

TEST(Tune, EveryTextThatGivesTheBudgetSharesGivesTheCoresOwn) {
  // docs/python.md said search 35 %, the tune docstring 40 %, the core 30 %.
  const auto percent = [](double share) { return std::to_string(std::lround(share * 100)); };
  const std::string shares = "precision " + percent(kPrecisionBudgetShare) + " %, search " +
                             percent(kSearchBudgetShare) + " %, sweep " +
                             percent(kSweepBudgetShare) + " %, the goodput noise run " +
                             percent(kNoiseBudgetShare) + " %";
  const std::string rest = "the evaluation batch " + percent(kEvalBudgetShare) +
                           " %, loader tuning " + percent(kLoaderBudgetShare) + " %";
  for (const char* file : {"docs/python.md", "python/batchtune/_tune.py", "docs/manual.md",
                           "docs/measurement.md"}) {
    std::ifstream in(std::string(BATCHTUNE_SOURCE_DIR) + "/" + file);
    ASSERT_TRUE(in) << file;
    // Words as a reader sees them: line breaks and indentation are spaces.
    std::string text;
    for (std::string word; in >> word;) text += word + " ";
    EXPECT_NE(text.find(shares), std::string::npos) << file << " lacks: " << shares;
    if (std::string(file) != "docs/manual.md") {
      EXPECT_NE(text.find(rest), std::string::npos) << file << " lacks: " << rest;
    }
  }
}

TEST(Tune, BadOptionsNameTheOption) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  FakeSubject subject(1024);
  TrialRunner runner(subject, *memory, 0.1);
  EXPECT_NE(testing::error_of([&] { tune(runner, TuneOptions().time_budget_s(0)); })
                .find("--time-budget"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { tune(runner, TuneOptions().tolerance(2)); }).find("--tolerance"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] {
              tune(runner, TuneOptions().noise_steps(int64_t{1} << 62));
            }).find("--noise-steps: must be from 1 to"),
            std::string::npos);
  PlanRequest bad;
  bad.target_batch = 0;
  EXPECT_NE(testing::error_of([&] { tune(runner, TuneOptions().plan(bad)); }).find("--target-batch"),
            std::string::npos);
}

/// A fake subject whose steps take time on a fake clock: `fixed_ms` +
/// `per_sample_ms` × batch, alternately 4 % fast and slow (a ±4 % interval);
/// its memory as `FakeSubject`'s.
class TimedSubject final : public TrialSubject {
 public:
  TimedSubject(testing::FakeClock& clock, AmpMode amp, double fixed_ms, double per_sample_ms,
               int64_t bytes_per_sample = 64 * 1024)
      : clock_(clock), amp_(amp), fixed_ms_(fixed_ms), per_sample_ms_(per_sample_ms),
        bytes_per_sample_(bytes_per_sample) {}
  std::string describe() const override { return "timed"; }
  AmpMode amp() const override { return amp_; }
  void save() override {}
  void prepare(int64_t batch_size) override { batch_size_ = batch_size; }
  at::Tensor step() override {
    const at::Tensor activations =
        at::empty({batch_size_ * bytes_per_sample_}, at::TensorOptions().dtype(at::kByte));
    (void)activations;
    const double ms = fixed_ms_ + per_sample_ms_ * static_cast<double>(batch_size_);
    clock_.advance(ms * (steps++ % 2 == 0 ? 0.96 : 1.04) / 1e3);
    return at::ones({});
  }
  void restore() override {}
  int64_t steps = 0;

 private:
  testing::FakeClock& clock_;
  AmpMode amp_;
  double fixed_ms_;
  double per_sample_ms_;
  int64_t bytes_per_sample_;
  int64_t batch_size_ = 0;
};

TEST(Tune, TheTimeBudgetHoldsForTheWholeRunPrecisionIncluded) {
  // A tune whose full search, sweep and re-measurement would take far longer
  // than the budget, on a fake clock that only the steps move: what is
  // checked is the pipeline's accounting, not this machine's speed.
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  testing::FakeClock clock;
  TimedSubject fp32(clock, AmpMode::kOff, 5, 0.4);
  TimedSubject bf16(clock, AmpMode::kBf16, 2.5, 0.2);  // twice as fast
  TrialRunner fp32_runner(fp32, *memory, 0.1);
  TrialRunner bf16_runner(bf16, *memory, 0.1);
  const RunnerAt runner_at = [&](AmpMode amp) -> TrialRunner& {
    return amp == AmpMode::kBf16 ? bf16_runner : fp32_runner;
  };
  constexpr double kBudgetS = 20;
  Recorder recorder;
  const TuneResult r =
      tune(runner_at, *memory, TuneOptions().time_budget_s(kBudgetS).clock(&clock), &recorder);
  ASSERT_TRUE(r.complete);
  ASSERT_TRUE(r.plan.has_value());
  // Within the budget plus its tolerance: every trial was sized to what was left.
  EXPECT_LE(clock.now_s(), kBudgetS * (1 + kTimeBudgetTolerance));
  EXPECT_TRUE(r.budget_note.empty()) << r.budget_note;
  EXPECT_GE(r.threads, 1) << "the threads the trials ran on, not 0";
  // The precision ran first, inside the budget, and was measured to a decision.
  ASSERT_FALSE(r.phase_seconds.empty());
  EXPECT_EQ(r.phase_seconds.front().first, TunePhase::kPrecision);
  EXPECT_GT(r.phase_seconds.front().second, 0);
  EXPECT_EQ(r.amp, AmpMode::kBf16) << r.amp_reason;
  ASSERT_TRUE(r.amp_confidence.has_value()) << r.amp_reason;
  EXPECT_GE(*r.amp_confidence, kConfidenceLevel);
  for (const auto& t : r.search.trials) EXPECT_EQ(t.amp, AmpMode::kBf16);
  double phases = 0;
  for (const auto& [phase, seconds] : r.phase_seconds) phases += seconds;
  EXPECT_NEAR(phases, clock.now_s(), 1e-6) << "the phases account for the whole run";
  // Every sweep row carries the interval of its median, and its estimate
  // (the fastest step) is at least the median's speed.
  ASSERT_FALSE(r.sweep.empty());
  for (const auto& row : r.sweep) {
    EXPECT_GT(row.samples_per_s_ci.n, 0) << row.batch_size;
    const double median_speed = 1e3 * static_cast<double>(row.batch_size) / row.step_ms;
    EXPECT_LE(row.samples_per_s_ci.low, median_speed * (1 + 1e-12)) << row.batch_size;
    EXPECT_GE(row.samples_per_s_ci.high, median_speed * (1 - 1e-12)) << row.batch_size;
    EXPECT_GE(row.samples_per_s, median_speed * (1 - 1e-12)) << row.batch_size;
  }
  const nlohmann::json json = to_json(r);
  EXPECT_TRUE(json.at("phase_seconds").contains("precision"));
  EXPECT_TRUE(json.at("selection").contains("confidence"));
  EXPECT_TRUE(json.at("sweep").at(0).at("samples_per_s_ci").is_array());
}

TEST(Tune, ASearchAfterAnOverrunPrecisionPhaseStillRunsAndTheOverrunIsSaid) {
  // Steps of 3 s against a 20 s budget: the precision's rounds outlast the
  // precision's and the search's shares together.
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  testing::FakeClock clock;
  TimedSubject fp32(clock, AmpMode::kOff, 3000, 0);
  TimedSubject bf16(clock, AmpMode::kBf16, 2000, 0);
  TrialRunner fp32_runner(fp32, *memory, 0.1);
  TrialRunner bf16_runner(bf16, *memory, 0.1);
  const RunnerAt runner_at = [&](AmpMode amp) -> TrialRunner& {
    return amp == AmpMode::kBf16 ? bf16_runner : fp32_runner;
  };
  const TuneResult r = tune(runner_at, *memory, TuneOptions().time_budget_s(20).clock(&clock));
  ASSERT_FALSE(r.phase_seconds.empty());
  EXPECT_GT(r.phase_seconds.front().second, (kPrecisionBudgetShare + kSearchBudgetShare) * 20);
  EXPECT_GE(r.search.max_batch_size, 1) << r.search.stop_reason;
  EXPECT_FALSE(r.budget_note.empty());
}

/// Records each phase's opening line.
class PhaseLines final : public TuneReporter {
 public:
  void phase_started(TunePhase phase, const std::string& line) override { lines[phase] = line; }
  std::map<TunePhase, std::string> lines;
};

// From Python, amp="auto" with time_budget=20 on a GPT-2: the precision
// phase said "(at most 2 s)" and took about 11 s, and the search got
// "(at most 1 s)".
TEST(Tune, APrecisionPhaseKeepsToItsShareAndSaysAFirstRoundThatOutlastsIt) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  const auto precision_seconds = [](const TuneResult& r) {
    EXPECT_EQ(r.phase_seconds.front().first, TunePhase::kPrecision);
    return r.phase_seconds.front().second;
  };
  {
    // Steps of 0.3 s: a round (a warm-up and a timed step of each precision)
    // takes 1.2 s, so a second would end past the 2 s share: not started.
    testing::FakeClock clock;
    TimedSubject fp32(clock, AmpMode::kOff, 300, 0);
    TimedSubject bf16(clock, AmpMode::kBf16, 300, 0);
    TrialRunner fp32_runner(fp32, *memory, 0.1);
    TrialRunner bf16_runner(bf16, *memory, 0.1);
    const RunnerAt runner_at = [&](AmpMode amp) -> TrialRunner& {
      return amp == AmpMode::kBf16 ? bf16_runner : fp32_runner;
    };
    const TuneResult r = tune(runner_at, *memory,
                              TuneOptions().time_budget_s(20).clock(&clock).search_only(true));
    EXPECT_LE(precision_seconds(r), kPrecisionBudgetShare * 20) << r.amp_reason;
    EXPECT_NE(r.amp_reason.find("share of the time budget ran out"), std::string::npos)
        << r.amp_reason;
    EXPECT_EQ(r.amp_reason.find("past the precision's share"), std::string::npos) << r.amp_reason;
  }
  {
    // Steps of 1 s: the first round alone takes 4 s of a 2 s share. It runs,
    // is said with its overrun, and no second round starts; the search
    // still gets its own share of the total.
    testing::FakeClock clock;
    TimedSubject fp32(clock, AmpMode::kOff, 1000, 0);
    TimedSubject bf16(clock, AmpMode::kBf16, 1000, 0);
    TrialRunner fp32_runner(fp32, *memory, 0.1);
    TrialRunner bf16_runner(bf16, *memory, 0.1);
    const RunnerAt runner_at = [&](AmpMode amp) -> TrialRunner& {
      return amp == AmpMode::kBf16 ? bf16_runner : fp32_runner;
    };
    PhaseLines lines;
    const TuneResult r =
        tune(runner_at, *memory, TuneOptions().time_budget_s(20).clock(&clock), &lines);
    EXPECT_NEAR(precision_seconds(r), 4, 1e-9)
        << "one round, a warm-up and a timed step of each: " << r.amp_reason;
    EXPECT_NE(r.amp_reason.find("its first round alone took 4.0 s, 2.0 s past the precision's "
                                "share of the time budget"),
              std::string::npos)
        << r.amp_reason;
    EXPECT_NE(lines.lines[TunePhase::kSearch].find("at most 6 s"), std::string::npos)
        << lines.lines[TunePhase::kSearch];
  }
}

TEST(Tune, ABudgetTooShortForEvenTheShortestTrialsSaysSo) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  testing::FakeClock clock;
  TimedSubject slow(clock, AmpMode::kOff, 2000, 0);  // two seconds a step
  TrialRunner runner(slow, *memory, 0.1);
  const TuneResult r = tune(runner, TuneOptions().time_budget_s(3).clock(&clock));
  EXPECT_GT(clock.now_s(), 3 * (1 + kTimeBudgetTolerance));
  EXPECT_NE(r.budget_note.find("least measurement"), std::string::npos) << r.budget_note;
  EXPECT_NE(r.budget_note.find("time budget of 3 s"), std::string::npos) << r.budget_note;
  EXPECT_THROW(tune(runner, TuneOptions().time_budget_s(0.5).clock(&clock)), Error)
      << "below the least budget: refused before anything runs";
}

TEST(Tune, ARunnerTuneKeepsTheRunnersClock) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  testing::FakeClock clock;
  TimedSubject subject(clock, AmpMode::kOff, 5, 0.1);
  TrialRunner runner(subject, *memory, 0.1);
  const Clock* own = &runner.clock();
  tune(runner, TuneOptions().time_budget_s(5).clock(&clock).search_only(true));
  EXPECT_EQ(&runner.clock(), own) << "the tune's clock is lent for the run only";
}

TEST(Tune, ASearchOnlyTuneGivesTheSearchTheWholeBudget) {
  // Steps so slow that the search cannot finish in the 8 s that the
  // precision's and its own share grant beside a sweep (it then stops at
  // its time budget), but can in the 18 s the precision phase leaves it
  // under --search-only.
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  testing::FakeClock clock;
  TimedSubject slow(clock, AmpMode::kOff, 1500, 2);
  TrialRunner runner(slow, *memory, 0.1);
  const TuneResult r =
      tune(runner, TuneOptions().time_budget_s(20).clock(&clock).search_only(true));
  EXPECT_FALSE(r.search.hit_time_budget) << r.search.stop_reason;
  EXPECT_TRUE(r.search.confirmed) << r.search.stop_reason;
  EXPECT_GT(r.search.seconds, 12) << r.search.stop_reason;
}

TEST(Tune, TheReportsUsableMemoryIsTheOneTheTrialsWereJudgedAgainst) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  testing::FakeClock clock;
  TimedSubject subject(clock, AmpMode::kOff, 5, 0.1);
  std::optional<TrialRunner> runner;  // made when the tune first asks, as the CLI's is
  const RunnerAt runner_at = [&](AmpMode) -> TrialRunner& {
    if (!runner) runner.emplace(subject, *memory, 0.1);
    return *runner;
  };
  const TuneResult r = tune(
      runner_at, *memory,
      TuneOptions().time_budget_s(20).clock(&clock).amp(AmpMode::kOff).search_only(true));
  ASSERT_FALSE(r.search.trials.empty());
  EXPECT_EQ(r.usable_bytes, r.search.trials.front().usable_bytes);
  EXPECT_LT(r.usable_bytes, r.capacity_bytes) << "the 10 % margin off the capacity";
  const std::string html = html_report(r);
  EXPECT_NE(html.find("usable 57.6 MiB (10 % margin)"), std::string::npos)
      << html.substr(html.find("capacity"), 120);
}

TEST(Tune, WithoutASweepThePlanIsAtTheLargestThatFits) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  testing::FakeClock clock;
  TimedSubject subject(clock, AmpMode::kOff, 5, 0.1);
  TrialRunner runner(subject, *memory, 0.1);
  const TuneResult r = tune(runner, TuneOptions().time_budget_s(20).clock(&clock).sweep(false));
  ASSERT_GT(r.search.max_batch_size, 0);
  EXPECT_TRUE(r.sweep.empty());
  EXPECT_FALSE(r.search_only);
  EXPECT_EQ(r.selection.batch_size, r.search.max_batch_size);
  ASSERT_TRUE(r.plan.has_value());
  EXPECT_EQ(r.plan->micro_batch_size, r.search.max_batch_size);
}

TEST(Tune, ThePythonFrontEndsTextsNameItsArgumentsAndSayWhereValuesCameFrom) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  testing::FakeClock clock;
  TimedSubject subject(clock, AmpMode::kOff, 5, 0.1);
  TrialRunner runner(subject, *memory, 0.1);
  PlanRequest request;
  request.target_batch = 64;
  request.world_size = 2;  // one process planning for a job of two
  request.sources = {{Option::kBaseLr, "the optimizer's lr"}};
  const TuneResult r = tune(runner, TuneOptions()
                                        .time_budget_s(20)
                                        .clock(&clock)
                                        .amp(AmpMode::kOff)
                                        .search(SearchOptions().max_batch(16))
                                        .plan(request)
                                        .front_end(FrontEnd::kPython));
  ASSERT_TRUE(r.plan.has_value());
  EXPECT_EQ(r.plan->world_size, 2);
  EXPECT_EQ(r.plan->global_batch_size, 64);
  EXPECT_EQ(r.search.stop_reason.rfind("reached max_batch 16", 0), 0u) << r.search.stop_reason;
  EXPECT_NE(r.plan->reason(PlanField::kLr).find("(the optimizer's lr)"), std::string::npos)
      << r.plan->reason(PlanField::kLr);
  EXPECT_NE(r.plan->reason(PlanField::kGlobalBatch).find("target_batch 64"), std::string::npos)
      << r.plan->reason(PlanField::kGlobalBatch);
  ASSERT_FALSE(r.plan->warnings.empty());
  EXPECT_NE(r.plan->warnings[0].find("give base_batch"), std::string::npos) << r.plan->warnings[0];
  std::vector<std::string> texts{r.selection.reason, r.diagnosis.text, r.search.stop_reason};
  for (const PlanReason& reason : r.plan->reasons) texts.push_back(reason.text);
  texts.insert(texts.end(), r.plan->warnings.begin(), r.plan->warnings.end());
  for (const std::string& text : texts) EXPECT_EQ(text.find("--"), std::string::npos) << text;
  // The command line's tune names its flags.
  const TuneResult cli = tune(runner, TuneOptions()
                                          .time_budget_s(20)
                                          .clock(&clock)
                                          .amp(AmpMode::kOff)
                                          .search(SearchOptions().max_batch(16)));
  EXPECT_EQ(cli.search.stop_reason.rfind("reached --max-batch 16", 0), 0u) << cli.search.stop_reason;
}

TEST(Tune, ResolveChecksTheNestedOptionsAndKeepsOnePrecision) {
  const auto option_of = [](const TuneOptions& options) {
    try {
      resolve(options);
    } catch (const OptionError& e) {
      return std::optional<Option>(e.option());
    }
    return std::optional<Option>();
  };
  EXPECT_EQ(option_of(TuneOptions().search(SearchOptions().tolerance(1))), Option::kSearchTolerance);
  EXPECT_EQ(option_of(TuneOptions().search(SearchOptions().max_batch(0))), Option::kMaxBatch);
  EXPECT_EQ(option_of(TuneOptions().time_budget_s(0.5)), Option::kTimeBudget);
  EXPECT_EQ(option_of(TuneOptions()), std::nullopt);
  PlanRequest request;
  request.amp = AmpMode::kBf16;
  const ResolvedTuneOptions resolved = resolve(TuneOptions().amp(AmpMode::kAuto).plan(request));
  EXPECT_EQ(resolved->amp(), AmpMode::kBf16);
  EXPECT_FALSE(resolved->plan().amp.has_value()) << "one precision field";
}

TEST(Tune, EveryTrialRunsAtThePrecisionTheTuneResolved) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 512 * kMiB);
  Workload workload(WorkloadOptions().model("convnet").input_shape({3, 32, 32}).seed(1));
  const TuneResult r = tune(workload, *memory,
                            TuneOptions().time_budget_s(20).amp(AmpMode::kBf16).search(
                                SearchOptions().max_batch(64)));
  EXPECT_EQ(r.amp, AmpMode::kBf16);
  for (const auto& t : r.search.trials) EXPECT_EQ(t.amp, AmpMode::kBf16) << t.batch_size;
  for (const auto& row : r.sweep) EXPECT_EQ(row.amp, AmpMode::kBf16) << row.batch_size;
  ASSERT_TRUE(r.plan.has_value());
  EXPECT_EQ(r.plan->amp, AmpMode::kBf16) << "the plan trains at what was measured";
}

TEST(Tune, Bf16FitsALargerBatchThanFp32UnderTheSameLimit) {
  const auto max_fit = [](AmpMode amp) {
    auto memory = make_device_memory(c10::Device(c10::kCPU), 160 * kMiB);
    Workload workload(WorkloadOptions().model("convnet").input_shape({3, 64, 64}).seed(1));
    return tune(workload, *memory, TuneOptions().amp(amp).search_only(true).time_budget_s(120))
        .search.max_batch_size;
  };
  const int64_t fp32 = max_fit(AmpMode::kOff);
  const int64_t bf16 = max_fit(AmpMode::kBf16);
  EXPECT_GT(fp32, 0);
  EXPECT_GT(bf16, fp32 * 11 / 10) << "fp32 " << fp32 << ", bf16 " << bf16;
}

TEST(Tune, AResolvedPlanFromAFileRefusesAnotherWorkload) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 256 * kMiB);
  Workload mlp(WorkloadOptions().model("mlp").input_shape({1, 8, 8}).optimizer("sgd"));
  PlanRequest request;
  request.micro_batch_size = 16;
  request.amp = AmpMode::kOff;
  const Plan plan = resolve_plan(request, mlp, *memory);
  EXPECT_EQ(plan.workload.model, "mlp");
  EXPECT_EQ(plan.workload.optimizer, "sgd");
  const std::string path = ::testing::TempDir() + "tune_test_plan.json";
  {
    std::ofstream out(path);
    out << to_json(plan).dump();
  }
  PlanRequest from_file;
  from_file.plan_file = path;
  Workload lenet(WorkloadOptions().model("convnet").input_shape({1, 8, 8}).optimizer("sgd"));
  const std::string model = testing::error_of([&] { resolve_plan(from_file, lenet, *memory); });
  EXPECT_NE(model.find("model mlp"), std::string::npos) << model;
  Workload adam(WorkloadOptions().model("mlp").input_shape({1, 8, 8}).optimizer("adam"));
  const std::string optimizer = testing::error_of([&] { resolve_plan(from_file, adam, *memory); });
  EXPECT_NE(optimizer.find("optimizer sgd"), std::string::npos) << optimizer;
  Workload wider(WorkloadOptions().model("mlp").input_shape({1, 9, 9}).optimizer("sgd"));
  const std::string input = testing::error_of([&] { resolve_plan(from_file, wider, *memory); });
  EXPECT_NE(input.find("input"), std::string::npos) << input;
  // The same workload takes it, every reason saying where its value came from.
  const Plan again = resolve_plan(from_file, mlp, *memory);
  EXPECT_EQ(again.micro_batch_size, 16);
  EXPECT_NE(again.reason(PlanField::kMicroBatch).find("from the plan"), std::string::npos);
  EXPECT_NE(again.reason(PlanField::kWarmup).find("from the plan"), std::string::npos)
      << again.reason(PlanField::kWarmup);
  EXPECT_NE(again.reason(PlanField::kAmp).find("from the plan"), std::string::npos);
}

TEST(TrainingStep, TheTrialRunnerAndTheTrainerRunTheSameStep) {
  // One logical batch of all 32 samples a step: the trainer's shuffled
  // order changes only the summation order.
  const auto data = testing::toy_data({16}, 32, 4, 5);
  const auto batch = data->get_batch([] {
    std::vector<int64_t> all(32);
    for (int64_t i = 0; i < 32; ++i) all[static_cast<size_t>(i)] = i;
    return all;
  }());
  const auto make = [] {
    return Workload(WorkloadOptions().model("mlp").input_shape({16}).classes(4).optimizer("sgd").lr(0.1).seed(2));
  };
  constexpr int64_t kSteps = 5;
  const c10::Device cpu(c10::kCPU);

  Workload direct = make();
  TrainingStep step(direct, cpu);
  double direct_loss = 0;
  for (int64_t i = 0; i < kSteps; ++i) direct_loss = step.run(batch).item<double>();

  Workload trained = make();
  auto memory = make_device_memory(cpu, 256 * kMiB);
  Trainer trainer(trained, *memory,
                  make_plan(PlanOptions().micro_batch_size(32).optimizer("sgd").base_lr(0.1).warmup_steps(0)),
                  *data, nullptr, TrainOptions().steps(kSteps).measure_noise_scale(false));
  trainer.run();
  const auto a = direct.model().parameters();
  const auto b = trained.model().parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::allclose(a[i], b[i], 1e-5, 1e-6)) << "parameter " << i;
  }

  // The trial's last step is the direct run's last: the same step, kSteps times.
  Workload tried = make();
  TrialRunner runner(tried, *memory, 0.1);
  const TrialResult r = runner.run(TrialOptions().batch_size(32).warmup_steps(0).steps(kSteps)
                                       .batch_source([&](int64_t) { return batch; }));
  ASSERT_TRUE(r.fits) << r.error;
  EXPECT_NEAR(r.loss, direct_loss, 1e-6);
}

TEST(TrialRunner, Bf16MeasuresASmallerPeakThanFp32ForAConvnet) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 1024 * kMiB);
  Workload workload(WorkloadOptions().model("convnet").input_shape({3, 64, 64}).seed(1));
  TrialRunner fp32(workload, *memory, 0.1, AmpMode::kOff);
  TrialRunner bf16(workload, *memory, 0.1, AmpMode::kBf16);
  const TrialResult a = fp32.run(TrialOptions().batch_size(32).steps(1));
  const TrialResult b = bf16.run(TrialOptions().batch_size(32).steps(1));
  ASSERT_TRUE(a.fits && b.fits);
  EXPECT_EQ(b.amp, AmpMode::kBf16);
  EXPECT_LT(b.peak_bytes, a.peak_bytes * 9 / 10) << a.peak_bytes << " vs " << b.peak_bytes;
}

TEST(SyntheticDataset, BatchesComeFromAPoolAndAreTheSameForTheSameIndex) {
  SyntheticDataset data({3, 8, 8}, 10, 1000, 4);
  const Batch a = data.get_batch({3, 900});
  const Batch b = data.get_batch({900});
  EXPECT_TRUE(at::equal(a.inputs[0][1], b.inputs[0][0]));
  EXPECT_EQ(a.target[1].item<int64_t>(), b.target[0].item<int64_t>());
  EXPECT_FALSE(at::equal(a.inputs[0][0], a.inputs[0][1]));
  EXPECT_GE(a.target.min().item<int64_t>(), 0);
  EXPECT_LT(a.target.max().item<int64_t>(), 10);
}

}  // namespace
}  // namespace batchtune
