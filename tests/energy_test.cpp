#include "batchtune/tuning/energy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "cli_runner.h"

#include "batchtune/common/error.h"
#include "fake_clock.h"
#include "fake_sampler.h"
#include "test_helpers.h"

namespace batchtune {
namespace {

using testing::make_sample;

/// A sweep row whose energy comes from fake power readings over its trial,
/// the way tune attaches them: `watts` during `seconds` of timed steps.
SweepRow row_from_power(int64_t batch, double samples_per_s, double watts) {
  std::vector<Sample> samples;
  for (int i = 0; i < 5; ++i) {
    samples.push_back(make_sample("cpu", 50, std::nullopt, watts));
    samples.back().time_s = 0.1 * i;
  }
  const SampleSummary summary = summarize(samples, 0, 1).at(0);
  const double timed_s = 2.0;
  SweepRow r;
  r.batch_size = batch;
  r.samples_per_s = samples_per_s;
  const auto joules = trial_energy_joules(summary, timed_s, 2.5);
  if (joules) r.energy_j_per_sample = *joules / (samples_per_s * timed_s);
  return r;
}

TEST(Energy, TrialEnergyFromTheCounterElsePowerTimesTime) {
  SampleSummary counter;
  counter.energy_joules = 100;
  counter.mean_power_watts = 40;
  EXPECT_DOUBLE_EQ(*trial_energy_joules(counter, 2, 4), 50) << "the timed share of the counter";
  SampleSummary power;
  power.mean_power_watts = 40;
  EXPECT_DOUBLE_EQ(*trial_energy_joules(power, 2, 4), 80);
  EXPECT_FALSE(trial_energy_joules(SampleSummary{}, 2, 4).has_value());
}

TEST(Energy, ATrialsReadingsCoverItsTimedStepsOnly) {
  // Samples every 0.2 s from 0.2 to 4.0 s on the monitor's clock: the GPU
  // idles (snapshot, batch, warm-up, restore) except from 2.0 to 3.0 s,
  // where the timed steps ran at 96 %; the energy counter gains 300 J/s
  // busy and 60 J/s idle.
  testing::FakeClock clock;
  std::vector<std::vector<Sample>> script;
  double joules = 0;
  for (int i = 1; i <= 20; ++i) {
    const double t = 0.2 * i;
    const bool busy = t > 2.0 + 1e-9 && t <= 3.0 + 1e-9;
    joules += (busy ? 300 : 60) * 0.2;
    script.push_back({make_sample("cuda:0", busy ? 96.0 : 5.0, std::nullopt, std::nullopt, joules)});
  }
  Monitor monitor(std::make_unique<testing::FakeSampler>(clock, script),
                  MonitorOptions().interval_ms(200).rounds(20), clock);
  monitor.wait();
  TrialResult trial;
  // On the runner's clock, 100 s behind the monitor's.
  trial.timed_from_s = 2.05 - 100;
  trial.timed_to_s = 3.05 - 100;
  trial.step_seconds = {0.5, 0.5};
  attach_readings(monitor, "cuda:0", 100, trial);
  ASSERT_TRUE(trial.utilization.has_value());
  EXPECT_DOUBLE_EQ(*trial.utilization, 96.0);  // the whole trial's mean would be 28.7
  ASSERT_TRUE(trial.energy_joules.has_value());
  // The counter's growth between the window's first and last samples (2.2
  // and 3.0 s), all of it timed: no idle joules in it.
  EXPECT_NEAR(*trial.energy_joules, 300.0 * 0.8, 1e-6);

  TrialResult untimed;  // no timed step: no reading, not the whole window's
  attach_readings(monitor, "cuda:0", 100, untimed);
  EXPECT_FALSE(untimed.utilization.has_value());
  EXPECT_FALSE(untimed.energy_joules.has_value());
}

TEST(Energy, ZeusCostChoosesBetweenEnergyAndTimeByEta) {
  // 8: 50 W at 1000/s (0.05 J/sample); 16: 72 W at 1800/s (0.04); 32: 100 W at 2000/s (0.05).
  const std::vector<SweepRow> rows = {row_from_power(8, 1000, 50), row_from_power(16, 1800, 72),
                                      row_from_power(32, 2000, 100)};
  ASSERT_TRUE(rows[1].energy_j_per_sample.has_value());
  EXPECT_NEAR(*rows[1].energy_j_per_sample, 0.04, 1e-12);
  const auto costs = energy_costs(rows, 0.5);
  ASSERT_EQ(costs.size(), 3U);
  EXPECT_NEAR(costs[0].cost, 0.5 * 0.05 + 0.5 * 100 / 1000.0, 1e-12);
  EXPECT_NEAR(costs[1].cost, 0.5 * 0.04 + 0.5 * 100 / 1800.0, 1e-12);
  EXPECT_NEAR(costs[2].watts, 100, 1e-9);
  EXPECT_EQ(select_energy(rows, 0.5, "").batch_size, 16);
  EXPECT_EQ(select_energy(rows, 1.0, "").batch_size, 16) << "energy only: the least J/sample";
  EXPECT_EQ(select_energy(rows, 0.0, "").batch_size, 32) << "time only: the fastest";
  const Selection s = select_energy(rows, 0.5, "");
  EXPECT_NE(s.reason.find("100.0 W"), std::string::npos) << s.reason;
}

TEST(Energy, WithoutReadingsItSaysWhy) {
  SweepRow r;
  r.batch_size = 8;
  r.samples_per_s = 100;
  const std::string reason =
      "energy, power: /sys/class/powercap/intel-rapl:0/energy_uj: No such file or directory";
  const std::string message = testing::error_of([&] { select_energy({r}, 0.5, reason); });
  EXPECT_NE(message.find("unavailable, because /sys/class/powercap"), std::string::npos)
      << message;
  EXPECT_EQ(energy_unavailable_note("utilization: x; energy on cuda:0: nvml says Not Supported"),
            "energy per sample unavailable, because nvml says Not Supported");
  EXPECT_NE(energy_unavailable_note("").find("no energy or power readings"), std::string::npos);
  EXPECT_NE(testing::error_of([&] { energy_costs({r}, 1.5); }).find("--eta"), std::string::npos);
}

TEST(EnergyCli, WithoutACounterTheEnergyObjectiveSaysWhyBeforeTuning) {
  if (::access(kRaplEnergyPath, R_OK) == 0) GTEST_SKIP() << "RAPL is readable here";
  const auto r = testing::run_cli("tune --objective energy --model mlp --input 1x8x8 --device cpu");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("unavailable, because"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("sweep:"), std::string::npos) << "no sweep before the error";
  const auto bad = testing::run_cli("tune --eta 0.3 --model mlp --input 1x8x8 --device cpu");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--eta"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace batchtune
