#include "batchtune/reports/tune_report.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "batchtune/reports/tune_json.h"
#include "reports/svg_chart.h"

namespace batchtune {
namespace {

constexpr double kMiB = 1024.0 * 1024;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(SvgChart, TicksAreOneTwoOrFiveTimesAPowerOfTen) {
  const auto numbers = nice_ticks(0, 1920, 5, AxisUnit::kNumber);
  EXPECT_EQ(numbers, (std::vector<double>{0, 500, 1000, 1500, 2000}));
  EXPECT_EQ(axis_label(1500, AxisUnit::kNumber, 500, 2000), "1500");
  EXPECT_EQ(axis_label(40000, AxisUnit::kNumber, 10000, 50000), "40k");
  EXPECT_EQ(axis_label(2.5e6, AxisUnit::kNumber, 5e5, 3e6), "2.5M");

  const auto bytes = nice_ticks(0, 232 * kMiB, 5, AxisUnit::kBytes);
  ASSERT_EQ(bytes.size(), 6U);
  EXPECT_EQ(bytes[1], 50 * kMiB);
  EXPECT_EQ(bytes.back(), 250 * kMiB);
  EXPECT_EQ(axis_label(bytes[2], AxisUnit::kBytes, 50 * kMiB, 250 * kMiB), "100 MiB");
  EXPECT_EQ(axis_label(1.5 * 1024 * kMiB, AxisUnit::kBytes, 0.5 * 1024 * kMiB, 2048 * kMiB),
            "1.5 GiB");

  const auto seconds = nice_ticks(0, 0.0524, 5, AxisUnit::kSeconds);
  EXPECT_NEAR(seconds[1], 0.01, 1e-12);
  EXPECT_EQ(axis_label(seconds[5], AxisUnit::kSeconds, 0.01, seconds.back()), "50 ms");
  EXPECT_EQ(axis_label(20, AxisUnit::kSeconds, 5, 25), "20 s");

  EXPECT_EQ(nice_ticks(0, 100, 5, AxisUnit::kPercent),
            (std::vector<double>{0, 20, 40, 60, 80, 100}));
  EXPECT_EQ(axis_label(40, AxisUnit::kPercent, 20, 100), "40 %");
}

TrialResult trial(int64_t batch, bool fits, int64_t peak) {
  TrialResult t;
  t.batch_size = batch;
  t.fits = fits;
  t.failure = fits ? TrialFailure::kNone : TrialFailure::kOutOfMemory;
  t.peak_bytes = peak;
  t.steps_run = 3;
  t.step_ms = fits ? 10 : 0;
  if (!fits) t.error = "CPU out of memory: tried to allocate 8 MiB";
  return t;
}

TuneResult sample_report() {
  TuneResult r;
  r.workload = "convnet (95000 parameters)";
  r.device = "cpu";
  r.threads = 2;
  r.capacity_bytes = static_cast<int64_t>(256 * kMiB);
  r.usable_bytes = static_cast<int64_t>(232 * kMiB);
  r.margin = 0.1;
  r.search.max_batch_size = 960;
  r.search.stop_reason = "960 fits, 1024 does not";
  r.search.trials = {trial(64, true, static_cast<int64_t>(20 * kMiB)),
                     trial(1024, false, static_cast<int64_t>(250 * kMiB)),
                     trial(960, true, static_cast<int64_t>(230 * kMiB))};
  for (int64_t b : {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 960}) {
    SweepRow row;
    row.batch_size = b;
    row.samples_per_s = 100.0 * static_cast<double>(b) / (1 + static_cast<double>(b) / 64);
    row.samples_per_s_spread = 0.1;
    row.step_ms = static_cast<double>(b) / row.samples_per_s * 1000;
    row.busy = 1;
    row.peak_bytes = static_cast<int64_t>(kMiB * (4 + 0.24 * static_cast<double>(b)));
    row.flops_per_s = row.samples_per_s * 2e6;
    row.steps = 20;
    r.sweep.push_back(row);
  }
  r.selection.batch_size = 512;
  r.selection.reason = "within 5 % of the best throughput";
  for (int i = 0; i < 200; ++i) {
    // A CPU reading above 100 % must not stretch the axis.
    r.timeline.push_back({0.05 * i, i % 7 == 0 ? 122.0 : 60.0 + i % 30});
  }
  r.phases = {{0, 2, 64, "search"}, {2, 5, 1024, "search"}, {5, 7, 960, "search"},
              {7, 10, 512, "sweep"}};
  Plan plan;
  plan.micro_batch_size = 512;
  plan.accumulation_steps = 2;
  plan.global_batch_size = 1024;
  plan.reasons = {{PlanField::kGlobalBatch, "global batch 1024 as asked with --target-batch"}};
  r.plan = plan;
  r.command_line = "batchtune tune --model convnet --report r.html";
  r.generated_at = "2026-12-01 20:45 UTC";
  return r;
}

TEST(TuneResult, ThePageShowsLimitsFailuresPlanTablesAndProvenance) {
  const std::string html = html_report(sample_report());
  // Memory: the capacity and, beside it, the usable limit the fits are judged against.
  EXPECT_NE(html.find("capacity 256.0 MiB"), std::string::npos);
  EXPECT_NE(html.find("usable 232.0 MiB (fits are judged against it)"), std::string::npos);
  EXPECT_EQ(count(html, "class='limit'"), 2U);
  EXPECT_EQ(count(html, "class='cross'"), 1U) << "the failed trial";
  // Ticks: 1-2-5 steps, bytes in MiB, the largest fit ticked.
  EXPECT_NE(html.find("highlight' x="), std::string::npos);
  EXPECT_NE(html.find(">960</text>"), std::string::npos);
  EXPECT_NE(html.find(">250 MiB</text>"), std::string::npos);
  EXPECT_EQ(html.find("1.92k"), std::string::npos);
  // Spread as error bars, one per sweep row; GFLOP/s.
  EXPECT_EQ(count(html, "class='errorbar'"), 11U);
  EXPECT_NE(html.find("Achieved GFLOP/s"), std::string::npos);
  // Utilization: 0-100 %, the batch that ran shaded.
  EXPECT_NE(html.find(">100 %</text>"), std::string::npos);
  EXPECT_EQ(html.find(">120 %</text>"), std::string::npos);
  EXPECT_EQ(count(html, "class='band'"), 4U);
  EXPECT_NE(html.find("Readings above 100 % are drawn at 100 %"), std::string::npos);
  // The plan, both tables, the provenance.
  EXPECT_NE(html.find("<h2>Plan</h2>"), std::string::npos);
  EXPECT_NE(html.find("global batch <b>1024</b>"), std::string::npos);
  EXPECT_NE(html.find("<h2>Search trials</h2>"), std::string::npos);
  EXPECT_NE(html.find("out of memory"), std::string::npos);
  EXPECT_NE(html.find("tried to allocate 8 MiB"), std::string::npos);
  EXPECT_NE(html.find("<h2>Sweep</h2>"), std::string::npos);
  EXPECT_NE(html.find("<code>batchtune tune --model convnet --report r.html</code>"),
            std::string::npos);
  EXPECT_NE(html.find("2026-12-01 20:45 UTC"), std::string::npos);
  EXPECT_NE(html.find("Chosen batch size: 512"), std::string::npos);
  EXPECT_EQ(html.find("Interrupted"), std::string::npos);
}

TEST(TuneResult, TrialsOfOneBatchInARowShareOneBandAndOneLabel) {
  TuneResult r = sample_report();
  // A confirmation trial at 960, then three timed repeats of the sweep's 512.
  r.phases = {{0, 2, 64, "search"},  {2, 5, 960, "search"}, {5, 7, 960, "search"},
              {7, 8, 512, "sweep"},  {8, 9, 512, "sweep"},  {9, 10, 512, "sweep"}};
  const std::string html = html_report(r);
  EXPECT_EQ(count(html, "class='band'"), 3U);
  EXPECT_EQ(count(html, "fill='#555'>960</text>"), 1U);
  EXPECT_EQ(count(html, "fill='#555'>512</text>"), 1U);
}

TEST(TuneResult, AnInterruptedReportSaysSo) {
  TuneResult r = sample_report();
  r.complete = false;
  r.interrupted_by = "SIGINT";
  r.selection = {};
  r.sweep.resize(3);
  r.plan.reset();
  const std::string html = html_report(r);
  EXPECT_NE(html.find("<b>Interrupted</b> by SIGINT: this report is partial"), std::string::npos);
  EXPECT_NE(html.find("No batch size chosen"), std::string::npos);
  EXPECT_EQ(html.find("Chosen batch size: 0"), std::string::npos);
  EXPECT_EQ(html.find("<h2>Plan</h2>"), std::string::npos);
}

TEST(TuneResult, ACompiledModelsCompilationIsInTheJsonAndThePageAndAnEagerOnesIsNull) {
  TuneResult r = sample_report();
  EXPECT_TRUE(to_json(r).at("compile").is_null());
  EXPECT_EQ(html_report(r).find("Compiled:"), std::string::npos);
  r.compile = CompileRecord{12.5, 2, 1, "The compile phase ran 12.0 s before the budget."};
  const nlohmann::json json = to_json(r);
  EXPECT_DOUBLE_EQ(json.at("compile").at("compile_seconds").get<double>(), 12.5);
  EXPECT_EQ(json.at("compile").at("graphs"), 2);
  EXPECT_EQ(json.at("compile").at("recompiles"), 1);
  EXPECT_EQ(json.at("compile").at("note"), "The compile phase ran 12.0 s before the budget.");
  EXPECT_NE(html_report(r).find("Compiled: 12.5 s compiling, 2 graph(s), 1 recompile(s) in the "
                                "trials. The compile phase ran 12.0 s before the budget."),
            std::string::npos);
}

TEST(TuneResult, ASearchTheBudgetCutShortIsSaidToBeALowerBound) {
  TuneResult r;
  r.search.max_batch_size = 2;
  r.search.hit_time_budget = true;
  r.search.lower_bound = true;
  std::ostringstream console;
  ConsoleTuneReporter(console).finished(r);
  EXPECT_NE(console.str().find("2 fits, and is a lower bound"), std::string::npos)
      << console.str();
  EXPECT_EQ(to_json(r)["search"]["lower_bound"], true);
  r.search.lower_bound = false;
  std::ostringstream whole;
  ConsoleTuneReporter(whole).finished(r);
  EXPECT_EQ(whole.str().find("lower bound"), std::string::npos) << whole.str();
}

}  // namespace
}  // namespace batchtune
