#include "batchtune/common/interrupt.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>

#include "cli_runner.h"

namespace batchtune {
namespace {

using testing::run_cli;
using testing::run_cli_and_signal;

/// The signals at their defaults while in scope, as a terminal starts a
/// program, whatever the test runner inherited (a background job of a
/// script has SIGINT ignored).
class DefaultSignals {
 public:
  DefaultSignals() {
    for (const int s : kSignals) previous_[index(s)] = std::signal(s, SIG_DFL);
  }
  ~DefaultSignals() {
    for (const int s : kSignals) std::signal(s, previous_[index(s)]);
  }

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
  static int index(int s) { return s == SIGINT ? 0 : s == SIGTERM ? 1 : 2; }
  void (*previous_[3])(int) = {};
};

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST(InterruptHandler, TheFirstSignalOnlyAsksToStop) {
  DefaultSignals defaults;
  InterruptHandler interrupts;
  EXPECT_FALSE(interrupt_requested());
  std::raise(SIGTERM);
  EXPECT_TRUE(interrupt_requested());
  EXPECT_EQ(interrupt_signal(), SIGTERM);
  EXPECT_EQ(interrupt_exit_code(), 143);
  EXPECT_EQ(interrupt_name(), "SIGTERM");
  EXPECT_THROW(throw_if_interrupted(), Interrupted);
}

TEST(InterruptHandler, SighupIsAStopRequestToo) {
  DefaultSignals defaults;
  InterruptHandler interrupts;
  std::raise(SIGHUP);  // the terminal closed: not the end of the process
  EXPECT_TRUE(interrupt_requested());
  EXPECT_EQ(interrupt_exit_code(), 129);
  EXPECT_EQ(interrupt_name(), "SIGHUP");
}

TEST(InterruptHandler, ANewHandlerClearsTheOldRequest) {
  {
    InterruptHandler interrupts;
    request_interrupt(SIGINT);
    EXPECT_EQ(interrupt_exit_code(), 130);
  }
  InterruptHandler again;
  EXPECT_FALSE(interrupt_requested());
  EXPECT_NO_THROW(throw_if_interrupted());
}

TEST(InterruptHandler, ASignalInheritedAsIgnoredStaysIgnored) {
  // `nohup batchtune tune ...` (SIGHUP) or a script's background job
  // (SIGINT): the user asked not to be stopped by them.
  DefaultSignals defaults;
  std::signal(SIGHUP, SIG_IGN);
  std::signal(SIGINT, SIG_IGN);
  {
    InterruptHandler interrupts;
    std::raise(SIGHUP);
    std::raise(SIGINT);
    EXPECT_FALSE(interrupt_requested());
    std::raise(SIGTERM);  // not ignored: still a stop request
    EXPECT_EQ(interrupt_signal(), SIGTERM);
  }
  EXPECT_EQ(std::signal(SIGHUP, SIG_DFL), SIG_IGN) << "put back as it was";
}

TEST(InterruptHandler, ASecondSignalEndsTheProcessAtOnce) {
  DefaultSignals defaults;
  const pid_t pid = fork();
  if (pid == 0) {
    InterruptHandler interrupts;
    std::raise(SIGINT);
    std::raise(SIGINT);
    _exit(0);  // not reached: the second signal ends the process
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exited with " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGINT);
}

TEST(InterruptCli, SigintDuringTheSweepWritesThePartialJsonAndReport) {
  const std::string json = ::testing::TempDir() + "batchtune_interrupted_tune.json";
  const std::string html = ::testing::TempDir() + "batchtune_interrupted_tune.html";
  std::remove(json.c_str());
  std::remove(html.c_str());
  const auto r = run_cli_and_signal("tune --model mlp --input 1x16x16 --device cpu "
                                    "--memory-limit 32MiB --json " + json + " --report " + html,
                                    "sweep: timing", SIGINT);
  ASSERT_EQ(r.exit_code, 130) << r.output;
  EXPECT_NE(r.output.find("interrupted by SIGINT"), std::string::npos) << r.output;
  const auto j = read_json(json);
  EXPECT_EQ(j["complete"], false);
  EXPECT_EQ(j["interrupted_by"], "SIGINT");
  EXPECT_GT(j["max_batch_size"].get<int64_t>(), 0) << "the finished search is kept";
  EXPECT_FALSE(j["trials"].empty());
  EXPECT_LT(j["sweep"].size(), 8U) << "the sweep was cut short";
  struct stat st {};
  EXPECT_EQ(::stat(html.c_str(), &st), 0) << "the report is written too";
}

TEST(InterruptCli, SighupDuringTuneWritesThePartialJson) {
  const std::string json = ::testing::TempDir() + "batchtune_hup_tune.json";
  std::remove(json.c_str());
  const auto r = run_cli_and_signal("tune --model mlp --input 1x16x16 --device cpu "
                                    "--memory-limit 32MiB --json " + json,
                                    "sweep: timing", SIGHUP);
  ASSERT_EQ(r.exit_code, 129) << r.output;
  const auto j = read_json(json);
  EXPECT_EQ(j["complete"], false);
  EXPECT_EQ(j["interrupted_by"], "SIGHUP");
  EXPECT_FALSE(j["trials"].empty());
}

TEST(InterruptCli, SighupDuringTrainWritesACheckpointAndThePartialJson) {
  const std::string dir = ::testing::TempDir() + "batchtune_hup_train";
  const std::string json = dir + "/summary.json";
  ::mkdir(dir.c_str(), 0755);
  std::remove((dir + "/checkpoint.pt").c_str());
  std::remove(json.c_str());
  const auto r = run_cli_and_signal(
      "train --model mlp --input 1x8x8 --device cpu --amp off --batch-size 16 --steps 100000 "
      "--log-every 20 --checkpoint " + dir + " --json " + json,
      "step 20/", SIGHUP);
  ASSERT_EQ(r.exit_code, 129) << r.output;
  const auto j = read_json(json);
  EXPECT_EQ(j["complete"], false);
  EXPECT_EQ(j["interrupted_by"], "SIGHUP");
  struct stat st {};
  EXPECT_EQ(::stat((dir + "/checkpoint.pt").c_str(), &st), 0) << "no checkpoint";
}

TEST(InterruptCli, SigtermDuringTheSearchKeepsTheTrialsSoFar) {
  const std::string json = ::testing::TempDir() + "batchtune_terminated_tune.json";
  std::remove(json.c_str());
  // The signal arrives during the first trials, which take a while here
  // (fp32: amp auto would time both precisions before the search starts).
  const auto r = run_cli_and_signal("tune --model resnet18 --input 3x32x32 --device cpu "
                                    "--memory-limit 1GiB --amp off --strategy binsearch --search-only "
                                    "--json " + json,
                                    "searching the largest batch", SIGTERM);
  ASSERT_EQ(r.exit_code, 143) << r.output;
  const auto j = read_json(json);
  EXPECT_EQ(j["complete"], false);
  EXPECT_EQ(j["interrupted_by"], "SIGTERM");
  EXPECT_EQ(j["search"]["stop_reason"], "interrupted by SIGTERM");
  EXPECT_EQ(j["search"]["trials"], j["trials"].size());
}

TEST(InterruptCli, SigintDuringTrainSavesACheckpointThatResumes) {
  const std::string dir = ::testing::TempDir() + "batchtune_interrupted_train";
  const std::string json = dir + "/summary.json";
  ::mkdir(dir.c_str(), 0755);
  std::remove((dir + "/checkpoint.pt").c_str());
  std::remove(json.c_str());
  const std::string common =
      "train --model mlp --input 1x8x8 --device cpu --amp off --batch-size 16 --steps 100000 "
      "--checkpoint " + dir;
  const auto r = run_cli_and_signal(common + " --log-every 20 --json " + json, "step 20/",
                                    SIGINT);
  ASSERT_EQ(r.exit_code, 130) << r.output;
  EXPECT_NE(r.output.find("stopped early by SIGINT"), std::string::npos) << r.output;
  const auto j = read_json(json);
  EXPECT_EQ(j["complete"], false);
  EXPECT_EQ(j["interrupted_by"], "SIGINT");
  const int64_t steps = j["steps"].get<int64_t>();
  EXPECT_GE(steps, 20);

  const auto resumed = run_cli(
      "train --model mlp --input 1x8x8 --device cpu --amp off --batch-size 16 --steps " +
      std::to_string(steps + 3) + " --checkpoint " + dir + " --resume --json -");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("at step " + std::to_string(steps)), std::string::npos)
      << resumed.output;
  const auto done = nlohmann::json::parse(resumed.output.substr(resumed.output.find("\n{") + 1));
  EXPECT_EQ(done["steps"], steps + 3);
  EXPECT_EQ(done["complete"], true);
}

}  // namespace
}  // namespace batchtune
