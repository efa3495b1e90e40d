// `batchtune train` and `batchtune plan` from the command line.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "batchtune/data/fashion_mnist.h"
#include "cli_runner.h"

namespace {

/// How often `what` stands in `text`.
size_t occurrences(const std::string& text, const std::string& what) {
  size_t count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

using batchtune::testing::run_cli;

struct BadTrainInput {
  const char* args;
  const char* named;
};

class TrainCliBadInput : public ::testing::TestWithParam<BadTrainInput> {};

TEST_P(TrainCliBadInput, ExitsTwoWithOneLineNamingTheFlag) {
  const auto r = run_cli(GetParam().args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(GetParam().named), std::string::npos) << r.output;
  // One line of error; the command may have said what it trains first.
  const auto last = r.output.rfind('\n', r.output.size() - 2);
  const std::string error = r.output.substr(last == std::string::npos ? 0 : last + 1);
  EXPECT_EQ(error.rfind("batchtune: ", 0), 0U) << r.output;
}

constexpr const char* kSmall = " --model mlp --input 1x8x8 --device cpu --amp off";

INSTANTIATE_TEST_SUITE_P(
    Train, TrainCliBadInput,
    ::testing::Values(
        BadTrainInput{"train --model resnet18 --input 3x32x32 --device cpu --memory-limit 50MiB",
                      "--memory-limit"},
        BadTrainInput{"train --batch-size 0 --model mlp --input 1x8x8", "--batch-size"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --lr-scaling cubic",
                      "--lr-scaling"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --amp fp8", "--amp"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --device cpu --amp fp16",
                      "--amp"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --target-batch 0",
                      "--target-batch"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --warmup -2", "--warmup"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --base-lr -1",
                      "--base-lr"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --epochs 0", "--epochs"},
        BadTrainInput{"train --data text:/nonexistent/text --memory-limit 16MiB", "--data text:"},
        BadTrainInput{"train --data text:/tmp --input int64:64..16", "runs backwards"},
        BadTrainInput{"train --model mlp --input 1x8x8 --batch-size 8 --target-tokens 64",
                      "--target-tokens"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --log-every -1",
                      "--log-every"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --resume", "--resume"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --data cifar", "--data"},
        BadTrainInput{"train --batch-size 8 --model mlp --data fashion-mnist:/nonexistent",
                      "--data"},
        BadTrainInput{"train --batch-size 8 --model mlp --data fashion-mnist --input 3x32x32",
                      "--input"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --amp off "
                      "--target-batch 100000",
                      "--target-batch"},
        BadTrainInput{"train --plan /nonexistent/plan.json --model mlp --input 1x8x8", "--plan"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --target-accuracy 1.5",
                      "--target-accuracy"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --target-accuracy 0",
                      "--target-accuracy"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --target-accuracy 85",
                      "give 0.85"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --target-accuracy 0.9",
                      "no test split"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --eval-every -1",
                      "--eval-every"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --eval-every 10",
                      "--eval-every"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --target-loss 0",
                      "--target-loss"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --target-loss 1.5 "
                      "--target-accuracy 0.5",
                      "--target-loss: a run stops at one target"},
        BadTrainInput{"train --data text:/tmp --target-loss -1", "--target-loss"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --time-limit -1",
                      "--time-limit"},
        BadTrainInput{"train --data text:/tmp --time-limit -1", "--time-limit"},
        BadTrainInput{"train --data text:/tmp --target-accuracy 0.5", "--target-accuracy"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --adapt-every 10",
                      "--adapt-every: tunes --adapt"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --adapt --adapt-every 0",
                      "--adapt-every"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --adapt-lr batch",
                      "--adapt-lr: tunes --adapt"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --adapt --adapt-lr sgd",
                      "--adapt-lr"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --adapt --adapt-max-batch 4",
                      "--adapt-max-batch"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --adapt-min-batch 4",
                      "--adapt-min-batch: tunes --adapt"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --adapt --adapt-min-batch 16",
                      "--adapt-min-batch: 16 must be a multiple of the world size 1 and at most"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --adapt --adapt-min-batch -1",
                      "--adapt-min-batch: must be in [0, "},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --adapt --no-noise-scale",
                      "--adapt"},
        BadTrainInput{"train --data text:/tmp --adapt --batch-size 4", "--adapt"},
        BadTrainInput{"train --batch-size 8 --model mlp --input 1x8x8 --eval-every-samples 100",
                      "--eval-every-samples"},
        BadTrainInput{"plan --plan /nonexistent/plan.json", "--plan"}));

TEST(TrainCli, AdaptWritesItsBatchScheduleAndLogsEveryChange) {
  const auto r = run_cli(std::string("train --batch-size 8 --steps 60 --adapt --adapt-every 5") +
                         kSmall + " --log-every 0 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto json = nlohmann::json::parse(r.output.substr(r.output.find("\n{") + 1));
  ASSERT_TRUE(json.contains("batch_schedule")) << r.output;
  const auto& schedule = json["batch_schedule"];
  ASSERT_GE(schedule.size(), 1U);
  EXPECT_EQ(schedule[0]["step"], 0);
  EXPECT_EQ(schedule[0]["global_batch_size"], 8);
  for (const auto& change : schedule) {
    for (const char* key : {"step", "global_batch_size", "micro_batch_size",
                            "accumulation_steps", "lr", "noise_scale"}) {
      EXPECT_TRUE(change.contains(key)) << key;
    }
  }
  EXPECT_EQ(json["global_batch_size"], schedule.back()["global_batch_size"]);
  // Each change is a line of the log.
  EXPECT_EQ(occurrences(r.output, "adapt: global batch"), schedule.size() - 1) << r.output;
  // The summary shows the batch and lr over the steps.
  EXPECT_NE(r.output.find(fmt::format("--adapt: {} change(s) of the global batch:",
                                      schedule.size() - 1)),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("  steps 1-"), std::string::npos) << r.output;
}

TEST(TrainCli, ATimeLimitStopsTheRunCompleteAndSaysSo) {
  // A million steps of a tiny model would take minutes; the limit ends the
  // run after the step that reaches 1 s of training.
  const auto r = run_cli(std::string("train --batch-size 8 --steps 1000000 --time-limit 1") +
                         kSmall + " --log-every 0 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto json = nlohmann::json::parse(r.output.substr(r.output.find("\n{") + 1));
  EXPECT_EQ(json["time_limit_reached"], true) << r.output;
  EXPECT_EQ(json["complete"], true) << r.output;
  EXPECT_LT(json["steps"].get<int64_t>(), 1000000) << r.output;
  EXPECT_NE(r.output.find("stopped at the time limit after step"), std::string::npos) << r.output;
}

TEST(TrainCli, ATargetLossStopsAnImageRunAndSaysWhere) {
  // Any loss is below 1000: the mean of the first full window of 10 steps
  // reaches it.
  const auto r = run_cli(std::string("train --batch-size 8 --steps 500 --target-loss 1000") +
                         kSmall + " --log-every 0 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output.substr(r.output.find("\n{") + 1));
  EXPECT_EQ(j["target"]["metric"], "train_loss") << r.output;
  EXPECT_EQ(j["target"]["reached"], true) << r.output;
  EXPECT_EQ(j["steps_to_target"], 10) << r.output;
  EXPECT_EQ(j["steps"], 10) << "training stopped there";
  EXPECT_NE(r.output.find("over the last 10 steps reached the target"), std::string::npos)
      << r.output;
}

TEST(TrainCli, ALossThatIsNotFiniteIsSaidInALineAndTheJsonAndTheRunGoesOn) {
  // It ended at exit 0 with no word, JSON final_loss null.
  const auto r = run_cli(std::string("train --batch-size 8 --steps 60 --optimizer sgd --lr 1000") +
                         kSmall + " --log-every 0 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output.substr(r.output.find("\n{") + 1));
  EXPECT_EQ(j["divergence"]["kind"], "not_finite") << r.output;
  EXPECT_EQ(j["steps"], 60) << "it trains on and says so";
  EXPECT_NE(r.output.find("\nthe loss is not finite ("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the lr 1000 is likely too high; lower --lr"), std::string::npos)
      << r.output;
}

TEST(TrainCli, WithoutABatchSizeTunesFirstAndSaysWhy) {
  const auto r = batchtune::testing::run_cli(
      "train --model mlp --input 1x8x8 --device cpu --amp off --memory-limit 8MiB --steps 3 "
      "--json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tuned — largest that fits"), std::string::npos) << r.output;
  const auto j = nlohmann::json::parse(r.output.substr(r.output.find("\n{") + 1));
  EXPECT_GT(j["micro_batch_size"].get<int64_t>(), 0);
  EXPECT_EQ(j["steps"], 3);
}

TEST(TrainCli, TrainsWithAccumulationAndWritesTheSummaryJson) {
  const auto r = run_cli(std::string("train --batch-size 8 --target-batch 32 --steps 4") +
                         kSmall + " --log-every 2 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto json = nlohmann::json::parse(r.output.substr(r.output.find("\n{") + 1));
  for (const char* key : {"steps", "samples", "epochs", "final_loss", "test_accuracy",
                          "oom_recoveries", "micro_batch_size", "accumulation_steps",
                          "global_batch_size", "world_size", "seconds", "samples_per_s",
                          "noise_scale", "noise_scale_note", "complete", "interrupted_by",
                          "skipped_samples",
                          "data_wait_fraction", "input_bound", "skipped_steps", "loss_scale",
                          "tokens_per_s", "target", "steps_to_target", "seconds_to_target",
                          "samples_to_target", "divergence"}) {
    EXPECT_TRUE(json.contains(key)) << key;
  }
  EXPECT_EQ(json.size(), 27U);
  EXPECT_TRUE(json["divergence"].is_null()) << "four steps say nothing of the loss";
  EXPECT_TRUE(json["target"].is_null()) << "no target given";
  EXPECT_TRUE(json["steps_to_target"].is_null());
  EXPECT_TRUE(json["tokens_per_s"].is_null()) << "images have no tokens";
  EXPECT_EQ(json["skipped_steps"], 0);
  EXPECT_TRUE(json["loss_scale"].is_null()) << "no loss scaler without fp16";
  EXPECT_EQ(json["complete"], true);
  EXPECT_TRUE(json["noise_scale"].is_number()) << "accumulation measures it every step";
  EXPECT_EQ(json["skipped_samples"], 0);
  EXPECT_EQ(json["steps"], 4);
  EXPECT_EQ(json["samples"], 128);
  EXPECT_EQ(json["accumulation_steps"], 4);
  EXPECT_EQ(json["global_batch_size"], 32);
  EXPECT_TRUE(json["test_accuracy"].is_null());
  EXPECT_NE(r.output.find("step 2/4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("plan: micro-batch 8 x 4"), std::string::npos) << r.output;
}

TEST(TrainCli, StopsAtATargetAccuracyOnFashionMnistAndSaysWhere) {
  struct stat st{};
  if (::stat((std::string(batchtune::kFashionMnistDefaultDir) + "/t10k-images-idx3-ubyte.gz").c_str(),
             &st) != 0) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  // Half right is far below what an mlp reaches in 300 steps of 32.
  const auto r = run_cli("train --data fashion-mnist --model mlp --device cpu --amp off "
                         "--batch-size 32 --steps 300 --eval-every 20 --target-accuracy 0.5 "
                         "--log-every 0 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output.substr(r.output.find("\n{") + 1));
  EXPECT_EQ(j["target"]["metric"], "test_accuracy");
  EXPECT_EQ(j["target"]["reached"], true) << r.output;
  const int64_t steps = j["steps_to_target"].get<int64_t>();
  EXPECT_EQ(steps % 20, 0) << "reached at an evaluation";
  EXPECT_LT(steps, 300);
  EXPECT_EQ(j["steps"], steps) << "training stopped there";
  EXPECT_EQ(j["samples_to_target"], steps * 32);
  EXPECT_GE(j["test_accuracy"].get<double>(), 0.5);
  EXPECT_LE(j["seconds_to_target"].get<double>(), j["seconds"].get<double>());
  EXPECT_NE(r.output.find("target test accuracy 50.00 %: reached at step " +
                          std::to_string(steps)),
            std::string::npos)
      << r.output;
}

TEST(TrainCli, PlanWrittenByPlanIsReadBackByPlanAndTrain) {
  const std::string path = ::testing::TempDir() + "batchtune_cli_plan.json";
  const auto made = run_cli("plan --batch-size 8 --target-batch 24 --optimizer sgd --base-lr 0.1"
                            " --model mlp --input 1x8x8 --amp off --json " + path);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  EXPECT_NE(made.output.find("linear"), std::string::npos) << made.output;
  const auto checked = run_cli("plan --plan " + path);
  ASSERT_EQ(checked.exit_code, 0) << checked.output;
  EXPECT_NE(checked.output.find("a valid plan"), std::string::npos) << checked.output;
  const auto trained = run_cli("train --plan " + path + kSmall + " --steps 2 --json -");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_NE(trained.output.find("\"global_batch_size\": 24"), std::string::npos)
      << trained.output;

  std::ofstream(path) << R"({"micro_batch_size": 8, "accumulation_steps": 1})";
  const auto bad = run_cli("plan --plan " + path);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find(path), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("'world_size'"), std::string::npos) << bad.output;
}

TEST(TrainCli, APlanMadeForAnotherWorkloadIsRefusedNamingTheField) {
  const std::string path = ::testing::TempDir() + "batchtune_cli_plan_workload.json";
  const auto made = run_cli("plan --batch-size 8 --optimizer sgd --model mlp --input 1x8x8 "
                            "--device cpu --amp off --json " + path);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const auto model = run_cli("train --plan " + path +
                             " --model convnet --input 1x8x8 --device cpu --steps 1");
  EXPECT_EQ(model.exit_code, 2) << model.output;
  EXPECT_NE(model.output.find("model mlp"), std::string::npos) << model.output;
  const auto optimizer = run_cli("train --plan " + path +
                                 " --model mlp --input 1x8x8 --device cpu --optimizer adam --steps 1");
  EXPECT_EQ(optimizer.exit_code, 2) << optimizer.output;
  EXPECT_NE(optimizer.output.find("optimizer sgd"), std::string::npos) << optimizer.output;
  const auto input = run_cli("train --plan " + path + " --input 1x9x9 --device cpu --steps 1");
  EXPECT_EQ(input.exit_code, 2) << input.output;
  EXPECT_NE(input.output.find("input"), std::string::npos) << input.output;
}

TEST(TrainCli, ACheckpointingPlanTrainsWithItAndIsRefusedWithoutIt) {
  std::string dir = "/tmp/batchtune-cli-checkpointing-XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  {
    std::ofstream out(dir + "/doc.txt");
    for (int p = 0; p < 40; ++p) out << std::string(16 + p, static_cast<char>('a' + p % 26)) << "\n\n";
  }
  const std::string gpt = " --data text:" + dir +
                          " --layers 2 --heads 2 --width 32 --device cpu --amp off "
                          "--memory-limit 16MiB";
  const std::string path = ::testing::TempDir() + "batchtune_cli_plan_checkpointing.json";
  const auto tuned = run_cli("tune" + gpt + " --checkpointing on --time-budget 4 --json " + path);
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  std::ifstream in(path);
  const auto plan = nlohmann::json::parse(in)["plan"];
  EXPECT_EQ(plan["checkpointing"], "on") << plan.dump();
  EXPECT_NE(plan.dump().find("activation checkpointing on: as asked with --checkpointing"),
            std::string::npos)
      << plan.dump();
  const auto without = run_cli("train --plan " + path + gpt + " --steps 1");
  EXPECT_EQ(without.exit_code, 2) << without.output;
  EXPECT_NE(without.output.find("activation checkpointing on, this run has it off; give "
                                "--checkpointing on"),
            std::string::npos)
      << without.output;
  const auto with = run_cli("train --plan " + path + gpt + " --checkpointing on --steps 2 --json -");
  ASSERT_EQ(with.exit_code, 0) << with.output;
  const auto j = nlohmann::json::parse(with.output.substr(with.output.find("\n{") + 1));
  EXPECT_EQ(j["steps"], 2);
}

TEST(TrainCli, Resnet18ProbesWithCheckpointingAndAModelWithoutBlocksRefusesIt) {
  const auto probed = run_cli("probe --model resnet18 --input 3x32x32 --device cpu --amp off "
                              "--memory-limit 512MiB --batch-size 4 --checkpointing on");
  EXPECT_EQ(probed.exit_code, 0) << probed.output;
  const auto refused = run_cli("probe --model convnet --device cpu --batch-size 4 "
                               "--checkpointing on");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("--checkpointing: convnet has no blocks to recompute (resnet18's "
                                "and gpt's are); leave it off, or use --model resnet18 or gpt"),
            std::string::npos)
      << refused.output;
}

TEST(TrainCli, APlanWhoseMicroBatchWasGivenBindsOnlyWhatWasSaid) {
  const std::string path = ::testing::TempDir() + "batchtune_cli_plan_unbound.json";
  const auto made = run_cli("plan --batch-size 4 --device cpu --amp off --json " + path);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  EXPECT_NE(made.output.find("binds no model"), std::string::npos) << made.output;
  const auto trained =
      run_cli("train --plan " + path + " --model mlp --input 1x8x8 --device cpu --steps 1");
  EXPECT_EQ(trained.exit_code, 0) << trained.output;
}

TEST(TrainCli, AnFp16PlanOnTheCpuAndAPlanWithAnUnknownFieldAreRefused) {
  const std::string path = ::testing::TempDir() + "batchtune_cli_plan_fp16.json";
  const auto made = run_cli("plan --batch-size 4 --model mlp --input 1x8x8 --device cpu "
                            "--amp off --json " + path);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  std::string plan = text.str();
  const std::string off = "\"amp\": \"off\"";
  ASSERT_NE(plan.find(off), std::string::npos) << plan;
  std::ofstream(path) << std::string(plan).replace(plan.find(off), off.size(), "\"amp\": \"fp16\"");
  const auto fp16 = run_cli("train --plan " + path + " --model mlp --input 1x8x8 --steps 1");
  EXPECT_EQ(fp16.exit_code, 2) << fp16.output;
  EXPECT_NE(fp16.output.find("fp16"), std::string::npos) << fp16.output;

  std::ofstream(path) << std::string(plan).replace(plan.find(off), off.size(),
                                                   "\"amp\": \"off\", \"micro_batch\": 64");
  const auto unknown = run_cli("plan --plan " + path);
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_NE(unknown.output.find("'micro_batch'"), std::string::npos) << unknown.output;
}

// Tune what you train: a plan tuned under bf16 trains at its own
// micro-batch, under the same limit, with no out-of-memory.
TEST(TrainCli, ABf16TunedPlanTrainsAtItsMicroBatchWithoutOutOfMemory) {
  const std::string path = ::testing::TempDir() + "batchtune_cli_bf16_plan.json";
  const std::string workload = " --model convnet --input 3x32x32 --device cpu --memory-limit 48MiB";
  const auto tuned = run_cli("tune" + workload + " --amp bf16 --objective max-fit --time-budget 20 "
                             "--json " + path);
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  std::ifstream in(path);
  const auto tune = nlohmann::json::parse(in);
  ASSERT_EQ(tune.at("amp"), "bf16");
  const int64_t micro = tune.at("plan").at("micro_batch_size").get<int64_t>();
  EXPECT_EQ(tune.at("plan").at("amp"), "bf16");
  const auto trained = run_cli("train --plan " + path + workload + " --steps 3 --json -");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const auto summary = nlohmann::json::parse(trained.output.substr(trained.output.find("\n{") + 1));
  EXPECT_EQ(summary.at("oom_recoveries"), 0) << trained.output;
  EXPECT_EQ(summary.at("micro_batch_size"), micro);
}

}  // namespace

namespace {

// Threads that cannot start (here: a virtual-memory limit leaves no room
// for 256 thread stacks) end as a one-line error naming --workers, never in
// std::terminate. The process's own size differs between builds, so a few
// limits are tried; each must end cleanly, and one must hit the threads.
TEST(TrainCli, LoaderThreadsThatCannotStartAreAnErrorNotACrash) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves more address space than any ulimit -v allows";
#endif
  bool hit = false;
  for (const char* limit_kb : {"4000000", "4500000", "5000000", "6000000"}) {
    const auto r = run_cli(std::string("--version >/dev/null; ulimit -v ") + limit_kb + "; " +
                           BATCHTUNE_CLI_PATH +
                           " train --model mlp --input 1x8x8 --device cpu --amp off "
                           "--batch-size 2 --steps 3 --log-every 0 --workers 256");
    EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 2) << limit_kb << ": " << r.output;
    if (r.output.find("cannot start loader thread") != std::string::npos) {
      hit = true;
      EXPECT_EQ(r.exit_code, 2) << r.output;
      EXPECT_NE(r.output.find("--workers 256"), std::string::npos) << r.output;
    }
  }
  EXPECT_TRUE(hit) << "no limit tried left too little room for the threads";
}

TEST(TrainCli, ARangeTunePlansATokenBudgetThatTrainByTextRunsWithoutOutOfMemory) {
  // A folder of paragraphs of 16 to 64 bytes.
  std::string dir = "/tmp/batchtune-cli-text-XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  {
    std::ofstream out(dir + "/doc.txt");
    for (int p = 0; p < 200; ++p) out << std::string(17 + (p * 37) % 48, static_cast<char>('a' + p % 26)) << "\n\n";
  }
  // No --input: both read the range from the data, 16..63 tokens.
  const std::string gpt =
      " --data text:" + dir + " --layers 1 --heads 2 --width 32 --device cpu --amp off "
      "--memory-limit 16MiB";
  const std::string plan = ::testing::TempDir() + "batchtune_cli_token_plan.json";  // not in the text
  const auto tuned = run_cli("tune" + gpt + " --time-budget 4 --json " + plan);
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  EXPECT_NE(tuned.output.find("lengths from the data: --input int64:16..63"), std::string::npos)
      << tuned.output;
  EXPECT_NE(tuned.output.find("token budget"), std::string::npos) << tuned.output;
  std::ifstream in(plan);
  const auto tune_json = nlohmann::json::parse(in);
  ASSERT_TRUE(tune_json["plan"].contains("token_budget")) << tune_json.dump();
  EXPECT_EQ(tune_json["plan"]["length_buckets"].size(), 3U);  // 16, 32, 63
  // The lr belongs to the samples a step of the plan's tokens holds at the data's mean length.
  EXPECT_EQ(tune_json["plan"]["tokens_per_step"], tune_json["plan"]["token_budget"]);
  EXPECT_NE(tune_json["plan"].dump().find("the data's mean length 39."), std::string::npos)
      << tune_json["plan"].dump();
  const auto checked = run_cli("plan --plan " + plan);
  EXPECT_NE(checked.output.find("token budget:"), std::string::npos) << checked.output;
  const auto trained = run_cli("train --plan " + plan + gpt + " --json -");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const auto j = nlohmann::json::parse(trained.output.substr(trained.output.find("\n{") + 1));
  EXPECT_EQ(j["oom_recoveries"], 0);
  EXPECT_EQ(j["samples"], 200);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(j["token_budget"], tune_json["plan"]["token_budget"]);
  EXPECT_LE(j["padded_tokens"].get<int64_t>(), j["steps"].get<int64_t>() * 2 *
                                                   j["token_budget"].get<int64_t>());
  // --adapt from 64 real tokens a step: its schedule in tokens, each change a log line.
  const auto adapted = run_cli("train --plan " + plan + gpt +
                               " --target-tokens 64 --adapt --adapt-every 5 --json -");
  ASSERT_EQ(adapted.exit_code, 0) << adapted.output;
  const auto a = nlohmann::json::parse(adapted.output.substr(adapted.output.find("\n{") + 1));
  ASSERT_TRUE(a.contains("batch_schedule")) << adapted.output;
  const auto& schedule = a["batch_schedule"];
  ASSERT_GE(schedule.size(), 1U);
  EXPECT_EQ(schedule[0]["global_batch_size"], 64);
  EXPECT_EQ(a["target_tokens"], schedule.back()["global_batch_size"]);
  EXPECT_EQ(a["samples"], 200) << "every sample once, whatever the changes";
  EXPECT_EQ(occurrences(adapted.output, "real tokens per step (micro-batches of"),
            schedule.size() - 1)
      << adapted.output;
  EXPECT_NE(adapted.output.find("change(s) of the global batch (in tokens):"), std::string::npos)
      << adapted.output;
  // Checkpoints: a finished run resumed trains nothing and says so, with the
  // plan it was written with (no second quick tune).
  const std::string ckpt = dir + "-ckpt";
  const auto saved = run_cli("train" + gpt + " --steps 6 --checkpoint " + ckpt +
                             " --checkpoint-every 2 --json -");
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  EXPECT_EQ(occurrences(saved.output, "checkpoint " + ckpt + "/checkpoint.pt"), 3U)
      << saved.output;
  EXPECT_EQ(occurrences(saved.output, "plan: token budget"), 1U) << "the quick tune's, once";
  const auto resumed = run_cli("train" + gpt + " --steps 6 --checkpoint " + ckpt +
                               " --resume --json -");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("plan: from the checkpoint in " + ckpt), std::string::npos)
      << resumed.output;
  EXPECT_EQ(resumed.output.find("a quick tune"), std::string::npos) << resumed.output;
  const auto r = nlohmann::json::parse(resumed.output.substr(resumed.output.find("\n{") + 1));
  EXPECT_EQ(r["already_finished"], true);
  EXPECT_EQ(r["steps"], 6);
  if (std::system(("rm -rf '" + ckpt + "'").c_str()) != 0) ADD_FAILURE() << "rm -rf " << ckpt;
  if (std::system(("rm -rf '" + dir + "'").c_str()) != 0) ADD_FAILURE() << "rm -rf " << dir;
}

}  // namespace
