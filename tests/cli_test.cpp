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
        BadInput{"probe --batch-size 4 --margin 0.999999999", "--margin"},
        BadInput{"probe --batch-size 4 --classes 1", "--classes"},
        BadInput{"probe --batch-size 4 --classes 0", "--classes"},
        BadInput{"probe --batch-size 2 --model gpt --vocab 0", "--vocab"},
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
        BadInput{"probe --batch-size 2 --model gpt --layers 0", "--layers: gpt needs at least 1"},
        BadInput{"probe --batch-size 2 --model gpt --classes 10", "--classes"},
        BadInput{"probe --batch-size 2 --model mlp --input int64:8 --vocab 10", "--input"},
        BadInput{"probe --batch-size 2 --model /nonexistent/model.pt", "--model"},
        BadInput{"frobnicate", "frobnicate"},
        // Numbers out of range, each where it enters (issue 20).
        BadInput{"probe --batch-size 4611686018427387904", "--batch-size"},
        BadInput{"probe --batch-size 1073741824 --model mlp --input 65536x65536", "--batch-size"},
        BadInput{"probe --batch-size 4 --lr 1e39", "--lr"},
        BadInput{"probe --batch-size 4 --lr nan", "--lr"},
        BadInput{"probe --batch-size 4 --threads 100000", "--threads"},
        BadInput{"probe --batch-size 4 --steps 9223372036854775807", "--steps"},
        BadInput{"probe --batch-size 4 --warmup-steps -1", "--warmup-steps"},
        BadInput{"probe --batch-size 4 --classes 9223372036854775807", "--classes"},
        BadInput{"probe --batch-size 4 --model gpt --layers 9223372036854775807", "--layers"},
        BadInput{"probe --batch-size 4 --input 99999999999999x2", "--input"},
        BadInput{"probe --batch-size 2 --model gpt --vocab 9223372036854775807", "--vocab"},
        BadInput{"monitor --interval 9223372036854775807", "--interval"},
        // Resources: a model larger than the limit fails as it is built.
        BadInput{"probe --batch-size 2 --model gpt --layers 20000 --memory-limit 256MiB",
                 "--memory-limit"},
        BadInput{"probe --batch-size 2 --memory-limit 10KiB", "--memory-limit"},
        // Outputs, checked before the work.
        BadInput{"probe --batch-size 2 --json /nonexistent-folder/out.json", "--json"},
        BadInput{"probe --batch-size 2 --json /tmp", "--json"},
        BadInput{"probe --batch-size 2 --batch-sise 3", "--batch-size"}));

INSTANTIATE_TEST_SUITE_P(
    TuneTrainPlan, CliBadInput,
    ::testing::Values(
        BadInput{"tune --max-batch 9223372036854775807", "--max-batch"},
        BadInput{"estimate --gpu H1000", "--gpu"},
        BadInput{"estimate --gpu cpu", "--memory-limit"},
        BadInput{"estimate --gpu H100 --memory-limit 1GiB", "--memory-limit"},
        BadInput{"tune --workers 40000", "--workers"},
        BadInput{"tune --prefetch 1000000", "--prefetch"},
        BadInput{"tune --json /nonexistent-folder/out.json", "--json"},
        BadInput{"tune --report /tmp", "--report"},
        BadInput{"tune --json /proc/version", "--json"},
        BadInput{"tune --max-batchs 16", "did you mean --max-batch"},
        BadInput{"train --model mlp --input 1x8x8 --device cpu --batch-size 2 "
                 "--epochs 9223372036854775807",
                 "--epochs"},
        BadInput{"train --model mlp --input 1x8x8 --device cpu --batch-size 2 --steps 1 "
                 "--workers 40000",
                 "--workers"},
        BadInput{"train --model mlp --input 1x8x8 --device cpu --batch-size 2 --steps 1 "
                 "--checkpoint /dev/null/ckpt",
                 "--checkpoint"},
        BadInput{"train --model mlp --input 1x8x8 --device cpu --batch-size 2 --steps 1 "
                 "--json /nonexistent-folder/out.json",
                 "--json"},
        // A count of zero where it must be positive (issue 27).
        BadInput{"train --model mlp --input 1x8x8 --device cpu --batch-size 2 --steps 0",
                 "--steps"},
        BadInput{"train --batch-size 2 --target-tokens 0", "--target-tokens"},
        BadInput{"train --data text:/usr/share/common-licenses --input 3x8x8 --batch-size 2",
                 "--input"},
        BadInput{"plan --batch-size 8 --target-batch 9223372036854775807", "--target-batch"},
        BadInput{"plan --batch-size 4611686018427387904", "--batch-size"},
        BadInput{"plan --batch-size 8 --base-lr 1e39", "--base-lr"},
        BadInput{"plan --batch-size 8 --warmup 9223372036854775807", "--warmup"},
        BadInput{"plan --batch-size 1048576 --target-batch 1099511627776 --optimizer sgd "
                 "--base-lr 0.1 --base-batch 1 --model mlp --input 1x8x8 --device cpu --amp off",
                 "--base-lr"}));

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

TEST(Cli, EstimateAnswersForAGpuFromTheCpu) {
  const auto r = run_cli("estimate --model convnet --input 3x32x32 --gpu L4 --amp bf16 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["device"], "L4");
  EXPECT_GT(j["max_batch_size"].get<int64_t>(), 0);
  EXPECT_LE(j["max_batch_size"].get<int64_t>(), j["max_batch_size_high"].get<int64_t>());
  EXPECT_GT(j["breakdown"]["context"].get<int64_t>(), 0);
  EXPECT_GT(j["breakdown"]["activations"].get<int64_t>(), 0);
  EXPECT_LE(j["peak_bytes"].get<int64_t>(), j["capacity_bytes_high"].get<int64_t>());
  EXPECT_FALSE(j["confidence"].get<std::string>().empty());
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
  // The threads the console names, not 0 (--threads was not given).
  const size_t threads_at = r.output.find(" thread(s)");
  ASSERT_NE(threads_at, std::string::npos) << r.output;
  const size_t number_at = r.output.rfind(' ', threads_at - 1) + 1;
  EXPECT_EQ(j["threads"].get<int>(), std::stoi(r.output.substr(number_at, threads_at - number_at)));
  EXPECT_GE(j["threads"].get<int>(), 1);
  for (const auto& t : j["trials"]) {
    EXPECT_TRUE(t.contains("batch_size") && t.contains("fits") && t.contains("peak_bytes"));
  }
  // The probe runs the step the search measured: at the precision the
  // tune resolved (amp auto picks bf16 here when this CPU times it faster).
  const std::string amp = " --amp " + j["amp"].get<std::string>();
  const auto at_max = run_cli("probe " + workload + amp + " --batch-size " +
                              std::to_string(max) + " --json -");
  EXPECT_TRUE(nlohmann::json::parse(at_max.output)["fits"].get<bool>()) << at_max.output;
  const auto above = run_cli("probe " + workload + amp + " --batch-size " +
                             std::to_string(static_cast<int64_t>(max * 1.05 + 1)) + " --json -");
  EXPECT_FALSE(nlohmann::json::parse(above.output)["fits"].get<bool>()) << above.output;
}

TEST(Cli, TuneWhereNotEvenBatchOneFitsExitsTwoSayingWhatItNeeded) {
  const auto r = run_cli("tune --model resnet18 --input 3x32x32 --memory-limit 60MiB --device cpu");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const std::string last = r.output.substr(r.output.rfind('\n', r.output.size() - 2) + 1);
  EXPECT_EQ(last.rfind("batchtune: --memory-limit: not even batch", 0), 0U) << r.output;
  EXPECT_NE(last.find("peak reached"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("largest batch that fits: 0"), std::string::npos) << r.output;
}

TEST(Cli, MaxBatchCapIsNamedInTheDiagnosisAndTuneHelpHidesBatchSize) {
  const auto r = run_cli(
      "tune --model mlp --input 1x8x8 --memory-limit 16MiB --device cpu --max-batch 2 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output.substr(r.output.find("\n{") + 1));
  EXPECT_TRUE(j["search"]["hit_max_batch"].get<bool>());
  if (j["diagnosis"]["kind"] != "compute-bound") {
    EXPECT_EQ(j["diagnosis"]["kind"], "max-batch-bound") << j["diagnosis"].dump();
    EXPECT_NE(j["diagnosis"]["text"].get<std::string>().find("--max-batch"), std::string::npos);
  }
  EXPECT_LT(j["utilization_note"].get<std::string>().size(), 200U) << j["utilization_note"];
  EXPECT_TRUE(j.contains("utilization_details"));
  const auto help = run_cli("tune --help");
  EXPECT_EQ(help.output.find("--batch-size"), std::string::npos) << help.output;
  EXPECT_NE(help.output.find("--max-batch"), std::string::npos) << help.output;
}

TEST(Cli, VersionMistypedFlagsAndProbesOldWarmupSpelling) {
  const auto version = run_cli("--version");
  EXPECT_EQ(version.exit_code, 0) << version.output;
  EXPECT_EQ(version.output.rfind("batchtune ", 0), 0U) << version.output;
  EXPECT_NE(version.output.find("LibTorch"), std::string::npos) << version.output;
  const auto command = run_cli("tnue --model mlp");
  EXPECT_EQ(command.exit_code, 2) << command.output;
  EXPECT_NE(command.output.find("did you mean tune?"), std::string::npos) << command.output;
  for (const char* help : {"tune --help", "train --help"}) {
    EXPECT_NE(run_cli(help).output.find("text:DIR"), std::string::npos) << help;
  }
  const auto typo = run_cli("probe --batch-size 2 --warmpu-steps 1");
  EXPECT_EQ(typo.exit_code, 2) << typo.output;
  EXPECT_NE(typo.output.find("did you mean --warmup-steps?"), std::string::npos) << typo.output;
  EXPECT_NE(typo.output.find("batchtune probe --help"), std::string::npos) << typo.output;
  const auto old = run_cli("probe --model mlp --input 1x8x8 --device cpu --memory-limit 64MiB "
                           "--batch-size 2 --steps 1 --warmup 2 --min-time 0 --json -");
  ASSERT_EQ(old.exit_code, 0) << old.output;
  EXPECT_NE(old.output.find("--warmup-steps"), std::string::npos) << old.output;
  const auto j = nlohmann::json::parse(old.output.substr(old.output.find("\n{") + 1));
  EXPECT_EQ(j["steps"], 3) << "2 untimed steps and 1 timed";
}

TEST(Cli, PlanWithLrSaysNotScaled) {
  const auto r = run_cli("plan --model mlp --input 1x8x8 --device cpu --amp off --batch-size 8 "
                         "--lr 0.01");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("lr 0.01 (not scaled)"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("sqrt scaling"), std::string::npos) << r.output;
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
