#include "batchtune/monitoring/monitor.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sstream>
#include <thread>

#include "cli_runner.h"
#include "fake_clock.h"
#include "fake_sampler.h"

namespace {

using batchtune::Monitor;
using batchtune::MonitorOptions;
using batchtune::Sample;
using batchtune::testing::FakeClock;
using batchtune::testing::FakeSampler;
using batchtune::testing::make_sample;
using batchtune::testing::run_cli;

constexpr double kTimeTolerance = 1e-9;

int thread_count() {
  int count = 0;
  DIR* tasks = opendir("/proc/self/task");
  if (tasks == nullptr) return -1;
  while (const dirent* entry = readdir(tasks)) count += entry->d_name[0] != '.';
  closedir(tasks);
  return count;
}

std::vector<std::vector<Sample>> utilization_script(const std::vector<double>& percents) {
  std::vector<std::vector<Sample>> script;
  for (double p : percents) script.push_back({make_sample("cuda:0", p)});
  return script;
}

TEST(Monitor, TakesOneRoundPerIntervalFromOneIntervalAfterTheStart) {
  FakeClock clock(100.0);
  auto record = std::make_shared<FakeSampler::Record>();
  Monitor monitor(std::make_unique<FakeSampler>(clock, utilization_script({1, 2, 3, 4, 5}), record),
                  MonitorOptions().interval_ms(200).rounds(5), clock);
  monitor.wait();
  const auto samples = monitor.samples();
  ASSERT_EQ(samples.size(), 5u);
  for (size_t i = 0; i < samples.size(); ++i) {
    EXPECT_NEAR(samples[i].time_s, 100.0 + 0.2 * static_cast<double>(i + 1), kTimeTolerance);
    EXPECT_EQ(samples[i].utilization_percent, static_cast<double>(i + 1));
  }
  EXPECT_EQ(monitor.rounds(), 5);
  EXPECT_EQ(record->reads, 5);
}

TEST(Monitor, KeepsEveryDeviceOfARoundAndCallsBackWithIt) {
  FakeClock clock;
  std::vector<std::vector<Sample>> script = {
      {make_sample("cuda:0", 10), make_sample("cuda:1", 90)}};
  std::vector<size_t> round_sizes;
  Monitor monitor(std::make_unique<FakeSampler>(clock, script),
                  MonitorOptions().rounds(3).on_sample(
                      [&](const std::vector<Sample>& round) { round_sizes.push_back(round.size()); }),
                  clock);
  monitor.wait();
  EXPECT_EQ(monitor.samples().size(), 6u);
  EXPECT_EQ(round_sizes, (std::vector<size_t>{2, 2, 2}));
  const auto summaries = monitor.summarize(0, 10);
  ASSERT_EQ(summaries.size(), 2u);
  EXPECT_EQ(summaries[0].device, "cuda:0");
  EXPECT_DOUBLE_EQ(*summaries[0].mean_utilization_percent, 10);
  EXPECT_EQ(summaries[1].device, "cuda:1");
  EXPECT_DOUBLE_EQ(*summaries[1].mean_utilization_percent, 90);
}

TEST(Monitor, SummarizesAWindowExactly) {
  FakeClock clock;
  std::vector<std::vector<Sample>> script;
  const double percents[] = {10, 20, 30, 40, 50};
  const int64_t memory[] = {100, 400, 300, 200, 900};
  const double power[] = {50, 60, 70, 80, 90};
  const double energy[] = {1000, 1012, 1026, 1042, 1060};
  for (int i = 0; i < 5; ++i) {
    script.push_back({make_sample("cuda:0", percents[i], memory[i], power[i], energy[i]),
                      make_sample("cpu", std::nullopt)});
  }
  Monitor monitor(std::make_unique<FakeSampler>(clock, script),
                  MonitorOptions().interval_ms(200).rounds(5), clock);
  monitor.wait();
  // Samples at 0.2, 0.4, 0.6, 0.8, 1.0 s; the window holds 0.4, 0.6 and 0.8.
  const auto summaries = monitor.summarize(0.3, 0.9);
  ASSERT_EQ(summaries.size(), 2u);
  const auto& gpu = summaries[0];
  EXPECT_EQ(gpu.samples, 3);
  EXPECT_DOUBLE_EQ(*gpu.mean_utilization_percent, 30);
  EXPECT_EQ(*gpu.max_memory_used_bytes, 400);
  EXPECT_DOUBLE_EQ(*gpu.mean_power_watts, 70);
  EXPECT_DOUBLE_EQ(*gpu.energy_joules, 1042 - 1012);
  const auto& cpu = summaries[1];
  EXPECT_EQ(cpu.samples, 3);
  EXPECT_FALSE(cpu.mean_utilization_percent.has_value()) << "no reading must stay no number";
  EXPECT_FALSE(cpu.max_memory_used_bytes.has_value());
  EXPECT_FALSE(cpu.energy_joules.has_value());
  EXPECT_TRUE(monitor.summarize(5, 6).empty());
}

TEST(Summarize, PowerFromTheEnergyCounterWhenNoPowerReadings) {
  std::vector<Sample> samples = {make_sample("cpu", 50, std::nullopt, std::nullopt, 10),
                                 make_sample("cpu", 70, std::nullopt, std::nullopt, 25)};
  samples[0].time_s = 1.0;
  samples[1].time_s = 1.5;
  const auto summary = batchtune::summarize(samples, 0, 2).at(0);
  EXPECT_DOUBLE_EQ(*summary.mean_utilization_percent, 60);
  EXPECT_DOUBLE_EQ(*summary.energy_joules, 15);
  EXPECT_DOUBLE_EQ(*summary.mean_power_watts, 30);
  const auto one = batchtune::summarize(samples, 0, 1.2).at(0);
  EXPECT_FALSE(one.energy_joules.has_value()) << "one counter reading is no energy";
  EXPECT_FALSE(one.mean_power_watts.has_value());
}

TEST(Monitor, ExceptionInTheSamplerThreadReachesTheCallerOnWait) {
  FakeClock clock;
  Monitor monitor(std::make_unique<FakeSampler>(clock, utilization_script({7}),
                                                std::make_shared<FakeSampler::Record>(), 2),
                  MonitorOptions(), clock);
  try {
    monitor.wait();
    FAIL() << "wait() must rethrow the sampler's exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "fake sampler: the device went away");
  }
  EXPECT_EQ(monitor.samples().size(), 2u) << "what was read before the failure is kept";
  EXPECT_NO_THROW(monitor.stop()) << "rethrown once";
}

TEST(Monitor, ExceptionInTheSamplerThreadReachesTheCallerOnStop) {
  FakeClock clock;
  auto record = std::make_shared<FakeSampler::Record>();
  Monitor monitor(std::make_unique<FakeSampler>(clock, utilization_script({7}), record, 0),
                  MonitorOptions(), clock);
  while (record->reads == 0) std::this_thread::yield();
  EXPECT_THROW(monitor.stop(), std::runtime_error);
}

TEST(Monitor, DestructorWakesTheWaitAndJoinsTheThread) {
  const int before = thread_count();
  FakeClock clock(10.0);
  clock.hold();  // a round never falls due: only the destructor ends the wait
  auto record = std::make_shared<FakeSampler::Record>();
  {
    Monitor monitor(std::make_unique<FakeSampler>(clock, utilization_script({1}), record),
                    MonitorOptions().interval_ms(60'000), clock);
    EXPECT_EQ(thread_count(), before + 1);
    while (clock.holding() == 0) std::this_thread::yield();
  }
  EXPECT_EQ(thread_count(), before);
  EXPECT_TRUE(record->destroyed);
  EXPECT_EQ(record->reads, 0);
  ASSERT_EQ(clock.deadlines().size(), 1u) << "one wait, for the first round";
  EXPECT_DOUBLE_EQ(clock.deadlines()[0], 10.0 + 60.0);
  EXPECT_EQ(clock.now_s(), 10.0);
}

TEST(Monitor, DestructorSwallowsTheThreadsException) {
  FakeClock clock;
  auto record = std::make_shared<FakeSampler::Record>();
  EXPECT_NO_THROW({
    Monitor monitor(std::make_unique<FakeSampler>(clock, utilization_script({1}), record, 0),
                    MonitorOptions(), clock);
    while (record->reads == 0) std::this_thread::yield();
  });
}

TEST(Monitor, WaitsForEachRoundOnItsGridAndSkipsTheRoundsASlowReadMissed) {
  FakeClock clock(5.0);
  auto record = std::make_shared<FakeSampler::Record>();
  // The second read takes 0.05 s, two and a half intervals: rounds due at
  // 5.06 and 5.08 are skipped, the next wait is for 5.10.
  MonitorOptions options = MonitorOptions().interval_ms(20).rounds(4);
  options.on_sample([&](const std::vector<Sample>&) {
    if (record->reads == 2) clock.advance(0.05);
  });
  Monitor monitor(std::make_unique<FakeSampler>(clock, utilization_script({1}), record), options,
                  clock);
  monitor.wait();
  const std::vector<double> due = {5.02, 5.04, 5.10, 5.12};
  const auto deadlines = clock.deadlines();
  ASSERT_EQ(deadlines.size(), due.size());
  const auto samples = monitor.samples();
  ASSERT_EQ(samples.size(), due.size());
  for (size_t i = 0; i < due.size(); ++i) {
    EXPECT_NEAR(deadlines[i], due[i], kTimeTolerance) << "round " << i;
    EXPECT_NEAR(samples[i].time_s, due[i], kTimeTolerance) << "no round before its time";
  }
}

TEST(Monitor, RejectsANonPositiveInterval) {
  FakeClock clock;
  EXPECT_THROW(Monitor(std::make_unique<FakeSampler>(clock, utilization_script({1})),
                       MonitorOptions().interval_ms(0), clock),
               c10::Error);
}

std::vector<std::string> sample_lines(const std::string& output) {
  std::vector<std::string> lines;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != '#') lines.push_back(line);
  }
  return lines;
}

TEST(MonitorCli, PrintsOneLinePerSampleWithCpuUtilization) {
  const auto r = run_cli("monitor --count 2 --interval 50 --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto lines = sample_lines(r.output);
  ASSERT_EQ(lines.size(), 2u) << r.output;
  for (const auto& line : lines) {
    EXPECT_NE(line.find("cpu"), std::string::npos) << line;
    std::istringstream fields(line);
    double time_s = 0, util = -1;
    std::string device;
    fields >> time_s >> device >> util;
    EXPECT_TRUE(fields) << "utilization must be a number on the CPU: " << line;
    EXPECT_GE(util, 0);
  }
  EXPECT_NE(r.output.find("time_s"), std::string::npos) << r.output;
  if (!batchtune::gpu_unavailable_reason().empty()) {
    EXPECT_NE(r.output.find("# GPU utilization unavailable: "), std::string::npos) << r.output;
  }
}

TEST(MonitorCli, AutoOnThisMachineSaysWhyThereIsNoGpuUtilization) {
  const auto r = run_cli("monitor --count 2 --interval 20");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(sample_lines(r.output).size(), 2u) << r.output;
  if (batchtune::gpu_unavailable_reason().empty()) GTEST_SKIP() << "a GPU and NVML are here";
  EXPECT_NE(r.output.find(batchtune::kNvmlLibrary), std::string::npos) << r.output;
}

TEST(MonitorCli, JsonIsAHeadingThenOneObjectPerSample) {
  const auto r = run_cli("monitor --count 2 --interval 20 --device cpu --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream in(r.output);
  std::string line;
  std::vector<nlohmann::json> objects;
  while (std::getline(in, line)) objects.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(objects.size(), 3u) << r.output;
  EXPECT_EQ(objects[0]["interval_ms"], 20);
  EXPECT_TRUE(objects[0].contains("unavailable"));
  for (size_t i = 1; i < objects.size(); ++i) {
    EXPECT_EQ(objects[i]["device"], "cpu");
    EXPECT_TRUE(objects[i]["utilization_percent"].is_number()) << objects[i];
    EXPECT_TRUE(objects[i]["memory_used_bytes"].is_number()) << objects[i];
    EXPECT_TRUE(objects[i].contains("energy_j"));
    EXPECT_TRUE(objects[i].contains("power_w"));
  }
}

struct BadMonitorFlag {
  const char* args;
  const char* named;
};

class MonitorCliBadInput : public ::testing::TestWithParam<BadMonitorFlag> {};

TEST_P(MonitorCliBadInput, ExitsTwoWithOneLineNamingTheFlag) {
  const auto r = run_cli(GetParam().args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(GetParam().named), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    Flags, MonitorCliBadInput,
    ::testing::Values(BadMonitorFlag{"monitor --interval 0", "--interval"},
                      BadMonitorFlag{"monitor --interval abc", "--interval"},
                      BadMonitorFlag{"monitor --count -1", "--count"},
                      BadMonitorFlag{"monitor --count x", "--count"},
                      BadMonitorFlag{"monitor --device gpu", "--device"},
                      BadMonitorFlag{"monitor --pid -4", "--pid"},
                      BadMonitorFlag{"monitor --pid 2147483647 --count 1", "--pid"},
                      BadMonitorFlag{"monitor --frequency 3", "--frequency"}));

}  // namespace
