#include "batchtune/training/checkpoint.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/script.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/models/script_model.h"
#include "batchtune/step/workload.h"
#include "cli_runner.h"
#include "test_helpers.h"

namespace batchtune {
namespace {

constexpr int64_t kMemoryLimit = int64_t{1} << 30;

using testing::error_of;
using testing::toy_data;

/// A fresh checkpoint directory for one test.
std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "batchtune_checkpoint_" + name;
  // Not std::filesystem: libtorch.so exports its own copy, which crashes here.
  if (std::system(("rm -rf '" + dir + "'").c_str()) != 0) ADD_FAILURE() << "rm -rf " << dir;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

/// Runs a shell command; its exit code and output (stdout and stderr).
batchtune::testing::CliResult run_command(const std::string& command) {
  batchtune::testing::CliResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

Workload mlp(const std::string& optimizer = "adam") {
  return Workload(
      WorkloadOptions().model("mlp").input_shape({16}).classes(4).seed(7).optimizer(optimizer));
}

Plan small_plan(AmpMode amp = AmpMode::kOff) {
  Plan plan = make_plan(PlanOptions().micro_batch_size(8).base_lr(1e-3).base_batch(8));
  plan.amp = amp;
  return plan;
}

TrainSummary train(Workload& w, const std::string& dir, int64_t steps, bool resume = false,
                   const Plan& plan = small_plan()) {
  static const auto data = toy_data({16}, 64, 4, 6);
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  Trainer trainer(w, *memory, plan, *data, nullptr,
                  TrainOptions().steps(steps).seed(1).checkpoint_dir(dir).resume(resume));
  return trainer.run();
}

TEST(Checkpoint, Crc32MatchesTheStandardCheckValue) {
  EXPECT_EQ(crc32_of("123456789", 9), 0xCBF43926u);
}

TEST(Checkpoint, AFlippedByteInATensorIsRefusedNamingTheFile) {
  const std::string dir = fresh_dir("flipped");
  Workload w = mlp();
  train(w, dir, 2);
  const std::string path = dir + "/" + kCheckpointFile;
  std::string bytes = read_bytes(path);
  // Flip a byte inside the first parameter's data, found by its values.
  const at::Tensor first = w.model().parameters().front().detach().contiguous();
  const std::string needle(static_cast<const char*>(first.data_ptr()), 64);
  const size_t at = bytes.find(needle);
  ASSERT_NE(at, std::string::npos) << "the parameter's bytes are in the file";
  bytes[at + 17] = static_cast<char>(bytes[at + 17] ^ 0x40);
  write_bytes(path, bytes);

  Workload again = mlp();
  const auto before = testing::copies(again.model().parameters());
  const std::string message = error_of([&] { train(again, dir, 4, true); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("corrupt"), std::string::npos) << message;
  EXPECT_NE(message.find("model/param/0"), std::string::npos) << message;
  testing::expect_identical(before, again.model().parameters());  // nothing loaded
}

TEST(Checkpoint, AnotherOptimizerIsRefusedNamingTheField) {
  const std::string dir = fresh_dir("optimizer");
  Workload adam = mlp("adam");
  train(adam, dir, 2);
  Workload sgd = mlp("sgd");
  const std::string message = error_of([&] { train(sgd, dir, 4, true); });
  EXPECT_NE(message.find("optimizer adam, this one has sgd"), std::string::npos) << message;
  EXPECT_NE(message.find("--optimizer"), std::string::npos) << message;
}

TEST(Checkpoint, AnotherPrecisionIsRefusedNamingTheField) {
  const std::string dir = fresh_dir("amp");
  Workload w = mlp();
  train(w, dir, 2, false, small_plan(AmpMode::kOff));
  Workload bf16 = mlp();
  const std::string message =
      error_of([&] { train(bf16, dir, 4, true, small_plan(AmpMode::kBf16)); });
  EXPECT_NE(message.find("amp off, this one has bf16"), std::string::npos) << message;
}

TEST(Checkpoint, EveryFieldOfTheRunIsCompared) {
  RunIdentity a{"mlp (100 parameters)", "float32 16", "adam", "off", 1, 64, 640, 3, 1e-3, 10};
  EXPECT_NO_THROW(check_same_run(a, a, "ckpt"));
  const auto refused = [&](RunIdentity b, const char* field) {
    const std::string message = error_of([&] { check_same_run(a, b, "ckpt/checkpoint.pt"); });
    EXPECT_NE(message.find(field), std::string::npos) << field << ": " << message;
    EXPECT_NE(message.find("ckpt/checkpoint.pt"), std::string::npos) << message;
  };
  RunIdentity b = a;
  b.model = "convnet (5 parameters)";
  refused(b, "--model");
  b = a, b.input = "float32 3x8x8";
  refused(b, "--input");
  b = a, b.world_size = 2;
  refused(b, "world size");
  b = a, b.global_batch_size = 128;
  refused(b, "global batch");
  b = a, b.train_size = 641;
  refused(b, "training samples");
  b = a, b.seed = 4;
  refused(b, "--seed");
  b = a, b.lr = 2e-3;
  refused(b, "lr");
  b = a, b.warmup_steps = 0;
  refused(b, "--warmup");
}

TEST(Checkpoint, AFinishedRunIsReemittedNotRetrained) {
  const std::string dir = fresh_dir("finished");
  Workload w = mlp();
  const TrainSummary first = train(w, dir, 3);
  ASSERT_TRUE(first.complete);
  Workload again = mlp();
  const TrainSummary second = train(again, dir, 3, true);
  EXPECT_TRUE(second.already_finished);
  EXPECT_TRUE(second.complete);
  EXPECT_EQ(second.steps, 3);
  EXPECT_EQ(second.final_loss, first.final_loss);
  EXPECT_GT(second.final_loss, 0);
  EXPECT_EQ(second.samples_per_s, first.samples_per_s);
  EXPECT_GT(second.samples_per_s, 0);
  // A longer run goes on from it.
  Workload longer = mlp();
  const TrainSummary third = train(longer, dir, 5, true);
  EXPECT_FALSE(third.already_finished);
  EXPECT_EQ(third.resumed_from_step, 3);
  EXPECT_EQ(third.steps, 5);
}

TEST(Checkpoint, ACheckpointPastTheStepsOfAnUnfinishedRunIsRefused) {
  const std::string dir = fresh_dir("past");
  InterruptHandler interrupts;
  {
    Workload w = mlp();
    static const auto data = toy_data({16}, 64, 4, 6);
    auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
    Trainer trainer(w, *memory, small_plan(), *data, nullptr,
                    TrainOptions().steps(20).seed(1).checkpoint_dir(dir));
    trainer.set_before_step([](int64_t step) {
      if (step == 4) request_interrupt(SIGTERM);
    });
    EXPECT_FALSE(trainer.run().complete);
  }
  InterruptHandler fresh;
  Workload again = mlp();
  const std::string message = error_of([&] { train(again, dir, 3, true); });
  EXPECT_NE(message.find("past the 3 steps"), std::string::npos) << message;
}

TEST(Checkpoint, StaleTemporaryFilesAreRemoved) {
  const std::string dir = fresh_dir("stale");
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);  // a pid that no longer runs
  const std::string stale = dir + "/" + kCheckpointFile + ".tmp." + std::to_string(child);
  const std::string live = dir + "/" + kCheckpointFile + ".tmp." + std::to_string(getppid());
  const std::string other = dir + "/notes.tmp.1";
  for (const auto& path : {stale, live, other}) write_bytes(path, "x");
  Workload w = mlp();
  train(w, dir, 1);
  struct stat st {};
  EXPECT_NE(::stat(stale.c_str(), &st), 0) << "a dead writer's file goes";
  EXPECT_EQ(::stat(live.c_str(), &st), 0) << "a running writer's file stays";
  EXPECT_EQ(::stat(other.c_str(), &st), 0) << "files not of checkpoints stay";
}

TEST(Checkpoint, TheTrainedModelIsAStateDictByName) {
  const std::string dir = fresh_dir("state_dict");
  Workload w = mlp();
  train(w, dir, 2);
  const std::string bytes = read_bytes(dir + "/" + kModelStateFile);
  const c10::IValue loaded = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  ASSERT_TRUE(loaded.isGenericDict());
  const auto dict = loaded.toGenericDict();
  const auto named = w.model().named_parameters();
  ASSERT_FALSE(named.empty());
  EXPECT_EQ(dict.size(), named.size() + w.model().named_buffers().size());
  for (const auto& [name, tensor] : named) {
    EXPECT_EQ(name.find("param."), std::string::npos) << "by name, not by position: " << name;
    ASSERT_TRUE(dict.contains(name)) << name;
    EXPECT_TRUE(at::equal(dict.at(name).toTensor(), tensor.detach())) << name;
  }
}

TEST(Checkpoint, PythonsTorchLoadReadsTheTrainedModelByName) {
  const std::string python = BATCHTUNE_PYTHON_PATH;
  if (python.empty()) GTEST_SKIP() << "no Python with torch in this build";
  const std::string dir = fresh_dir("python");
  Workload w = mlp();
  train(w, dir, 2);
  const std::string first = w.model().named_parameters().front().first;
  // weights_only=True, the default since torch 2.6: plain tensors in a plain dict.
  const auto r = run_command(
      python + " -c \"import torch; d = torch.load('" + dir + "/" + kModelStateFile +
      "', weights_only=True); print(type(d).__name__, len(d), tuple(d['" + first +
      "'].shape))\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto shape = w.model().named_parameters().front().second.sizes();
  EXPECT_NE(r.output.find("dict " + std::to_string(w.model().named_parameters().size() +
                                                   w.model().named_buffers().size())),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("(" + std::to_string(shape[0]) + ", "), std::string::npos)
      << r.output;
}

TEST(Checkpoint, ATorchScriptModelIsSavedAsTorchScriptWithTheTrainedWeights) {
  const std::string dir = fresh_dir("script");
  torch::jit::Module m("Net");
  m.register_parameter("w", torch::randn({16, 4}).requires_grad_(true), false);
  m.define(R"(
    def forward(self, x):
        return torch.matmul(x, self.w)
  )");
  const std::string source = dir + "/source.pt";
  m.save(source);
  Workload w(WorkloadOptions().model(source).input_spec(classification_spec({16}, 4)).seed(1),
             load_script_model(source));
  const at::Tensor before = w.model().parameters().front().detach().clone();
  train(w, dir, 2);
  torch::jit::Module trained = torch::jit::load(dir + "/" + kModelScriptFile);
  const at::Tensor saved = trained.attr("w").toTensor();
  EXPECT_TRUE(at::equal(saved, w.model().parameters().front().detach()));
  EXPECT_FALSE(at::equal(saved, before)) << "the weights are the trained ones";
}

TEST(CheckpointCli, ResumingWithAnotherOptimizerExitsTwoNamingIt) {
  const std::string dir = fresh_dir("cli_optimizer");
  const std::string common =
      "train --model mlp --input 1x8x8 --device cpu --amp off --batch-size 16 --steps 2 "
      "--checkpoint " + dir;
  ASSERT_EQ(batchtune::testing::run_cli(common + " --optimizer adam").exit_code, 0);
  const auto r = batchtune::testing::run_cli(common + " --optimizer sgd --resume");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--optimizer"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("INTERNAL ASSERT"), std::string::npos) << r.output;
}

TEST(CheckpointCli, AResumeTakesTheCheckpointsPrecisionAndMeasuresNothing) {
  const std::string dir = fresh_dir("cli_amp");
  const std::string common =
      "train --model mlp --input 3x8x8 --device cpu --batch-size 8 --checkpoint " + dir;
  ASSERT_EQ(batchtune::testing::run_cli(common + " --amp off --steps 2").exit_code, 0);
  // amp auto (the default) on the resume: the checkpoint's, not a new measurement.
  const auto r = batchtune::testing::run_cli(common + " --steps 4 --resume");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("amp off: from the checkpoint in " + dir), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("interleaved rounds"), std::string::npos) << "nothing measured";
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
}

TEST(CheckpointCli, ResumingAFinishedRunReemitsItsSummary) {
  const std::string dir = fresh_dir("cli_finished");
  const std::string json = dir + "/summary.json";
  const std::string common =
      "train --model mlp --input 1x8x8 --device cpu --amp off --batch-size 16 --steps 3 "
      "--checkpoint " + dir + " --json " + json;
  ASSERT_EQ(batchtune::testing::run_cli(common).exit_code, 0);
  const auto first = nlohmann::json::parse(read_bytes(json));
  // A kill between the final checkpoint and the JSON: the JSON is gone.
  std::remove(json.c_str());
  const auto r = batchtune::testing::run_cli(common + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("already finished"), std::string::npos) << r.output;
  const auto again = nlohmann::json::parse(read_bytes(json));
  EXPECT_EQ(again["already_finished"], true);
  for (const char* key : {"steps", "samples", "final_loss", "samples_per_s", "seconds",
                          "complete"}) {
    EXPECT_EQ(again[key], first[key]) << key;
  }
  EXPECT_GT(again["samples_per_s"].get<double>(), 0);
}

/// Rewrites the record of `dir/checkpoint.pt` through `edit`, its checksum
/// recomputed: a hand edit that the checksum cannot catch.
void edit_record(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  const std::string path = dir + "/" + kCheckpointFile;
  torch::jit::Module archive = torch::jit::load(path);
  nlohmann::json meta = nlohmann::json::parse(archive.attr("meta").toStringRef());
  edit(meta);
  const std::string text = meta.dump();
  archive.setattr("meta", text);
  archive.setattr("meta_crc32", static_cast<int64_t>(crc32_of(text.data(), text.size())));
  archive.save(path);
}

/// One field of a record set to a value out of its range, and the field the
/// error must name.
struct BadField {
  std::string pointer;  ///< JSON pointer into the record
  nlohmann::json value;
  std::string field;
};

/// Each of `cases` applied to a copy of the checkpoint in `source`, then
/// `resume` run on it: exit 2, one line naming the file and the field, no
/// crash and no internal message.
void expect_each_refused(const std::string& source, const std::string& resume,
                         const std::vector<BadField>& cases) {
  for (const auto& c : cases) {
    SCOPED_TRACE(c.pointer + " = " + c.value.dump());
    const std::string dir = fresh_dir("edited");
    ASSERT_EQ(std::system(("cp '" + source + "/" + kCheckpointFile + "' '" + dir + "/'").c_str()),
              0);
    edit_record(dir, [&](nlohmann::json& meta) {
      ASSERT_TRUE(meta.contains(nlohmann::json::json_pointer(c.pointer))) << meta.dump();
      meta[nlohmann::json::json_pointer(c.pointer)] = c.value;
    });
    const auto r = batchtune::testing::run_cli(resume + " --checkpoint " + dir + " --resume");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(dir + "/" + kCheckpointFile + ": field '" + c.field + "'"),
              std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("Exception raised from"), std::string::npos) << r.output;
  }
}

TEST(CheckpointCli, AnAdaptStateOutOfRangeExitsTwoNamingTheFileAndTheField) {
  const std::string source = fresh_dir("cli_adapt_source");
  const std::string common =
      "train --model mlp --input 1x8x8 --device cpu --amp off --batch-size 8 --adapt "
      "--adapt-every 2 --log-every 0";
  ASSERT_EQ(batchtune::testing::run_cli(common + " --steps 6 --checkpoint " + source).exit_code,
            0);
  expect_each_refused(
      source, common + " --steps 8",
      {
          {"/adapt/policy/micro_batch_cap", -3, "adapt.policy.micro_batch_cap"},
          {"/adapt/policy/explored_from", -7, "adapt.policy.explored_from"},
          {"/adapt/lr_ramp_from", -1, "adapt.lr_ramp_from"},
          {"/adapt/noise/ema_trace", -2.4e114, "adapt.noise.ema_trace"},
          {"/adapt/noise/decay_power", 1.5, "adapt.noise.decay_power"},
          {"/adapt/batch_schedule/0/global_batch_size", 0,
           "adapt.batch_schedule[0].global_batch_size"},
          {"/adapt/batch_schedule/0/global_batch_size", -8,
           "adapt.batch_schedule[0].global_batch_size"},
          {"/adapt/batch_schedule/0/global_batch_size", 1e15,
           "adapt.batch_schedule[0].global_batch_size"},
          {"/adapt/batch_schedule/0/lr", -1, "adapt.batch_schedule[0].lr"},
          {"/position/step", -5, "position.step"},
          {"/position/batch_in_epoch", -1, "position.batch_in_epoch"},
      });
}

TEST(CheckpointCli, ATokenStateOutOfRangeExitsTwoNamingTheFileAndTheField) {
  std::string text = "/tmp/batchtune-checkpoint-text-XXXXXX";
  ASSERT_NE(::mkdtemp(text.data()), nullptr);
  {
    std::ofstream out(text + "/doc.txt");
    for (int p = 0; p < 40; ++p) {
      out << std::string(17 + (p * 37) % 48, static_cast<char>('a' + p % 26)) << "\n\n";
    }
  }
  const std::string source = fresh_dir("cli_tokens_source");
  const std::string common = "train --data text:" + text +
                             " --layers 1 --heads 2 --width 32 --device cpu --amp off "
                             "--batch-size 4 --target-tokens 128 --log-every 0";
  ASSERT_EQ(batchtune::testing::run_cli(common + " --steps 3 --checkpoint " + source).exit_code,
            0);
  expect_each_refused(source, common + " --steps 6",
                      {
                          {"/tokens/rest_of_epoch", 1e9, "tokens.rest_of_epoch"},
                          {"/tokens/tokens", -5, "tokens.tokens"},
                          {"/tokens/target_tokens", 0, "tokens.target_tokens"},
                          {"/tokens/token_budget", -1, "tokens.token_budget"},
                          {"/tokens/lr", -1, "tokens.lr"},
                          {"/tokens/rest_of_epoch/0/indices/0", 100000,
                           "tokens.rest_of_epoch[0].indices[0]"},
                      });
  std::system(("rm -rf '" + text + "'").c_str());
}

}  // namespace
}  // namespace batchtune
