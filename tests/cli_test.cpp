#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>

#include "cli_runner.h"

namespace {

using batchtune::testing::run_cli;

int count_lines(const std::string& text) {
  int lines = 0;
  for (char c : text) lines += c == '\n';
  return lines;
}

struct BadInput {
  const char* args;
  const char* named;  ///< what the one-line message must name
};

class CliBadInput : public ::testing::TestWithParam<BadInput> {};

TEST_P(CliBadInput, ExitsTwoWithOneLineNamingTheInput) {
  const auto r = run_cli(GetParam().args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(GetParam().named), std::string::npos) << r.output;
  EXPECT_EQ(count_lines(r.output), 1) << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    Probe, CliBadInput,
    ::testing::Values(
        BadInput{"probe --model vgg --batch-size 4", "--model"},
        BadInput{"probe --model convnet --batch-size 0", "--batch-size"},
        BadInput{"probe --batch-size 4 --input 3xx64", "--input"},
        BadInput{"probe --batch-size 4 --input 3x0x64", "--input"},
        BadInput{"probe --batch-size 4 --memory-limit 12parsecs", "--memory-limit"},
        BadInput{"probe --batch-size 4 --memory-limit 0", "--memory-limit"},
        BadInput{"probe --model resnet18 --batch-size 4 --memory-limit 1MiB", "--memory-limit"},
        BadInput{"probe --batch-size 4 --device gpu", "--device"},
        BadInput{"probe --batch-size 4 --optimizer lbfgs", "--optimizer"},
        BadInput{"probe --batch-size 4 --margin 1.5", "--margin"},
        BadInput{"probe --batch-size 4 --classes 1", "--classes"},
        BadInput{"probe --batch-size 4 --threads -1", "--threads"},
        BadInput{"probe --batch-size 4 --lr -1", "--lr"},
        BadInput{"probe --batch-size abc", "--batch-size"},
        BadInput{"probe", "--batch-size"},
        BadInput{"probe --batch-size 2 --model lenet --input 1x4x4", "--input"},
        BadInput{"probe --batch-size 2 --input int64:128", "--vocab"},
        BadInput{"probe --batch-size 2 --input 3x8x8 --vocab 100", "--vocab"},
        BadInput{"probe --batch-size 2 --input float8:3x8x8", "--input"},
        BadInput{"probe --batch-size 2 --loss hinge", "--loss"},
        BadInput{"probe --batch-size 2 --loss model", "--loss"},
        BadInput{"probe --batch-size 2 --target float", "--target"},
        BadInput{"probe --batch-size 2 --input-spec /nonexistent/spec.json", "--input-spec"},
        BadInput{"probe --batch-size 2 --input-spec s.json --input 3x8x8", "--input-spec"},
        BadInput{"probe --batch-size 2 --model gpt --width 30 --heads 4", "--width"},
        BadInput{"probe --batch-size 2 --model gpt --classes 10", "--classes"},
        BadInput{"probe --batch-size 2 --model mlp --input int64:8 --vocab 10", "--input"},
        BadInput{"probe --batch-size 2 --model /nonexistent/model.pt", "--model"},
        BadInput{"frobnicate", "frobnicate"}));

TEST(Cli, EnvSaysPlainlyWhetherThereIsAGpu) {
  const auto r = run_cli("env");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("LibTorch"), std::string::npos);
  EXPECT_NE(r.output.find("CPU"), std::string::npos);
  const auto j = run_cli("env --json");
  ASSERT_EQ(j.exit_code, 0) << j.output;
  const auto env = nlohmann::json::parse(j.output);
  for (const char* key : {"torch_version", "torch_cuda", "cuda_available", "device_count",
                          "devices", "nvml_available", "cpu_model", "cpu_cores", "threads",
                          "ram_total_bytes"}) {
    EXPECT_TRUE(env.contains(key)) << key;
  }
  if (!env["cuda_available"].get<bool>()) {
    EXPECT_NE(r.output.find("no GPU"), std::string::npos) << r.output;
    EXPECT_FALSE(env["cuda_reason"].is_null());
    EXPECT_EQ(env["device_count"], 0);
  }
  EXPECT_GE(env["threads"].get<int>(), 1);
}

TEST(Cli, ProbeThatFitsAndOneThatDoesNotBothExitZero) {
  const auto fits = run_cli(
      "probe --model convnet --input 3x32x32 --batch-size 8 --memory-limit 256MiB "
      "--device cpu --json -");
  ASSERT_EQ(fits.exit_code, 0) << fits.output;
  const auto j = nlohmann::json::parse(fits.output);
  EXPECT_EQ(j["batch_size"], 8);
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_TRUE(j["error"].is_null());
  EXPECT_GT(j["peak_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(j["capacity_bytes"].get<int64_t>(), int64_t{256} << 20);
  EXPECT_GT(j["step_ms"].get<double>(), 0);
  EXPECT_GT(j["samples_per_s"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(j["margin"].get<double>(), 0.1);
  EXPECT_TRUE(j.contains("usable_bytes"));

  const std::string path = ::testing::TempDir() + "probe_oom.json";
  const auto oom = run_cli(
      "probe --model convnet --input 3x32x32 --batch-size 4096 --memory-limit 64MiB "
      "--device cpu --json " + path);
  ASSERT_EQ(oom.exit_code, 0) << oom.output;
  EXPECT_NE(oom.output.find("fits          no"), std::string::npos) << oom.output;
  std::ifstream file(path);
  const auto o = nlohmann::json::parse(file);
  EXPECT_FALSE(o["fits"].get<bool>());
  EXPECT_NE(o["error"].get<std::string>().find("out of memory"), std::string::npos);
  std::remove(path.c_str());
}

TEST(Cli, HelpExitsZero) {
  EXPECT_EQ(run_cli("--help").exit_code, 0);
  EXPECT_EQ(run_cli("probe --help").exit_code, 0);
}

}  // namespace

namespace {

TEST(Cli, TuneSearchOnlyFindsAMaximumThatProbeConfirms) {
  const std::string workload =
      "--model convnet --input 3x32x32 --memory-limit 64MiB --device cpu";
  const auto r = run_cli("tune --search-only " + workload + " --json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output.substr(r.output.find("\n{") + 1));
  const int64_t max = j["max_batch_size"].get<int64_t>();
  EXPECT_GT(max, 0);
  EXPECT_EQ(j["search"]["strategy"], "predict");
  EXPECT_EQ(j["search"]["trials"].get<size_t>(), j["trials"].size());
  EXPECT_GT(j["search"]["steps"].get<int64_t>(), 0);
  EXPECT_GE(j["search"]["seconds"].get<double>(), 0);
  EXPECT_TRUE(j["complete"].get<bool>());
  for (const auto& t : j["trials"]) {
    EXPECT_TRUE(t.contains("batch_size") && t.contains("fits") && t.contains("peak_bytes"));
  }
  const auto at_max = run_cli("probe " + workload + " --batch-size " + std::to_string(max) +
                              " --json -");
  EXPECT_TRUE(nlohmann::json::parse(at_max.output)["fits"].get<bool>()) << at_max.output;
  const auto above = run_cli("probe " + workload + " --batch-size " +
                             std::to_string(static_cast<int64_t>(max * 1.05 + 1)) + " --json -");
  EXPECT_FALSE(nlohmann::json::parse(above.output)["fits"].get<bool>()) << above.output;
}

TEST(Cli, TuneBadSearchFlagsExitTwo) {
  for (const char* args : {"tune --strategy random", "tune --max-batch 0",
                           "tune --time-budget -1", "tune --search-tolerance 2"}) {
    const auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
  }
}

}  // namespace

namespace {

TEST(Cli, TuneSweepsChoosesAndReports) {
  const std::string html = ::testing::TempDir() + "tune_report.html";
  const auto r = run_cli(
      "tune --model mlp --input 1x8x8 --memory-limit 4MiB --device cpu --max-batch 64 "
      "--report " + html + " --json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output.substr(r.output.find("\n{") + 1));
  ASSERT_FALSE(j["sweep"].empty());
  const int64_t chosen = j["chosen_batch_size"].get<int64_t>();
  bool chosen_in_sweep = false;
  for (const auto& row : j["sweep"]) {
    for (const char* key : {"batch_size", "samples_per_s", "step_ms", "busy", "utilization",
                            "peak_bytes", "energy_j_per_sample"}) {
      EXPECT_TRUE(row.contains(key)) << key;
    }
    EXPECT_LE(row["batch_size"].get<int64_t>(), j["max_batch_size"].get<int64_t>());
    chosen_in_sweep |= row["batch_size"].get<int64_t>() == chosen;
  }
  EXPECT_TRUE(chosen_in_sweep);
  EXPECT_EQ(j["objective"], "throughput");
  EXPECT_FALSE(j["diagnosis"]["kind"].get<std::string>().empty());
  std::ifstream page(html);
  const std::string text((std::istreambuf_iterator<char>(page)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("<svg"), std::string::npos);
  EXPECT_NE(text.find("chosen: " + std::to_string(chosen)), std::string::npos);
  std::remove(html.c_str());
}

TEST(Cli, TuneMaxFitChoosesTheLargest) {
  const auto r = run_cli(
      "tune --model mlp --input 1x8x8 --memory-limit 4MiB --device cpu --max-batch 32 "
      "--objective max-fit --json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output.substr(r.output.find("\n{") + 1));
  EXPECT_EQ(j["chosen_batch_size"], j["max_batch_size"]);
}

}  // namespace
