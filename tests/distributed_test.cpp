// Data parallel over c10d: two local ranks on Gloo (loopback). The test
// binary starts itself twice through batchtune::launch, each copy running
// one `DistributedWorker` case as a rank; the parent checks their files.
#include "batchtune/distributed/distributed.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "batchtune/memory/budget_allocator.h"
#include "batchtune/distributed/data_parallel.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/distributed/launch.h"
#include "batchtune/reports/train_reporter.h"
#include "batchtune/training/trainer.h"
#include "batchtune/step/workload.h"
#include "cli_runner.h"
#include "distributed/wait.h"
#include "fake_clock.h"
#include "hang_guard.h"
#include "test_helpers.h"

namespace batchtune {
namespace {

constexpr int64_t kMemoryLimit = int64_t{1} << 30;
constexpr int64_t kWorkerTimeoutMs = 10000;
constexpr int64_t kMiB = int64_t{1} << 20;

using testing::toy_data;

/// Records every sample index the trainer reads.
class RecordingDataset final : public Dataset {
 public:
  explicit RecordingDataset(const Dataset& inner) : inner_(inner) {}
  int64_t size() const override { return inner_.size(); }
  Batch get_batch(const std::vector<int64_t>& indices) const override {
    seen.insert(seen.end(), indices.begin(), indices.end());
    return inner_.get_batch(indices);
  }
  std::vector<int64_t> sample_shape() const override { return inner_.sample_shape(); }
  int64_t classes() const override { return inner_.classes(); }
  std::string describe() const override { return inner_.describe(); }
  mutable std::vector<int64_t> seen;

 private:
  const Dataset& inner_;
};

// The run both the ranks and the single-process reference train: an MLP
// with SGD, 2 micro-batches of 4 per rank and logical batch (a global 16).
constexpr int64_t kSamples = 16 * 6 + 5;  // 6 logical batches an epoch, 5 left over
constexpr int64_t kSteps = 6;

Plan ddp_plan(int64_t world_size) {
  return make_plan(PlanOptions()
                       .micro_batch_size(4)
                       .target_batch(16)
                       .world_size(world_size)
                       .optimizer("sgd")
                       .base_lr(0.05)
                       .base_batch(16)
                       .warmup_steps(0));
}

Workload ddp_workload() {
  return Workload(
      WorkloadOptions().model("mlp").input_shape({12}).classes(4).optimizer("sgd").seed(7));
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void save_tensors(const std::string& path, const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  for (const auto& t : tensors) flat.push_back(t.detach().reshape({-1}));
  const at::Tensor all = at::cat(flat).contiguous();
  std::ofstream(path, std::ios::binary)
      .write(static_cast<const char*>(all.data_ptr()), all.numel() * 4);
}

at::Tensor load_tensors(const std::string& path) {
  const std::string bytes = read_text(path);
  at::Tensor t = at::empty({static_cast<int64_t>(bytes.size() / 4)}, at::kFloat);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

// ---- The ranks: run only when a test below starts them. ----

TEST(DistributedWorker, DISABLED_Rank) {
  const std::string dir = env_or("BATCHTUNE_TEST_DIR", "");
  const std::string mode = env_or("BATCHTUNE_TEST_MODE", "");
  ASSERT_FALSE(dir.empty());
  const RankEnvironment env = rank_environment();
  const std::string rank = std::to_string(env.rank);
  std::unique_ptr<Communicator> comm;
  try {
    comm = make_communicator(env, c10::Device(c10::kCPU),
                             std::chrono::milliseconds(kWorkerTimeoutMs));
  } catch (const std::exception& e) {
    write_text(dir + "/error" + rank, e.what());
    FAIL() << e.what();
  }
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  std::unique_ptr<TensorDataset> data;
  Plan plan;
  if (mode == "oom") {
    data = toy_data({1, 28, 28}, 128 * 6, 10, 3);
    plan = make_plan(PlanOptions().micro_batch_size(32).target_batch(128).world_size(2));
  } else {
    data = toy_data({12}, kSamples, 4, 5);
  }
  if (mode != "oom") plan = ddp_plan(env.world_size);
  RecordingDataset recording(*data);
  Workload w = mode == "oom"
                   ? Workload(WorkloadOptions().model("lenet").input_shape({1, 28, 28}).classes(10).seed(7))
                   : ddp_workload();
  if (env.rank == 1) {
    // A different start on rank 1: the broadcast from rank 0 must undo it.
    at::NoGradGuard no_grad;
    for (auto& p : w.model().parameters()) p.add_(1.0);
  }
  Trainer trainer(w, *memory, plan, recording, nullptr, TrainOptions().steps(kSteps).seed(3));
  trainer.set_communicator(comm.get());
  int64_t live = 0;
  int64_t step_peak = 0;
  trainer.set_before_step([&](int64_t step) {
    if (mode == "die" && env.rank == 1 && step == 2) ::_exit(3);
    if (mode == "die0" && env.rank == 0 && step == 2) ::_exit(3);  // and the store with it
    if (mode != "oom" || env.rank != 1) return;
    // Rank 1 alone: measure a step, then squeeze its budget below it.
    if (step == 1) {
      live = memory->live_bytes();
      memory->reset_peak();
    } else if (step == 2) {
      step_peak = memory->peak_bytes() - live;
    } else if (step == 3) {
      memory->set_usable_bytes(memory->live_bytes() + step_peak * 6 / 10);
    }
  });
  try {
    const TrainSummary summary = trainer.run();
    write_text(dir + "/summary" + rank, to_json(summary).dump());
  } catch (const std::exception& e) {
    write_text(dir + "/error" + rank, e.what());
    return;
  }
  save_tensors(dir + "/params" + rank, w.model().parameters());
  std::ostringstream seen;
  for (int64_t i : recording.seen) seen << i << " ";
  write_text(dir + "/seen" + rank, seen.str());
}

// ---- The tests. ----

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "batchtune_ddp_" + name + "_" +
                          std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

LaunchResult run_ranks(const std::string& dir, const std::string& mode, bool stop_on_failure,
                       std::string* output) {
  std::vector<std::vector<std::string>> env(2, {"BATCHTUNE_TEST_DIR=" + dir,
                                                "BATCHTUNE_TEST_MODE=" + mode,
                                                "OMP_NUM_THREADS=1"});
  std::ostringstream out;
  const LaunchResult result = launch(
      LaunchOptions()
          .nproc(2)
          .program("/proc/self/exe")
          .args({"--gtest_filter=DistributedWorker.DISABLED_Rank",
                 "--gtest_also_run_disabled_tests"})
          .rank_env(env)
          .stop_on_failure(stop_on_failure),
      out);
  *output = out.str();
  return result;
}

TEST(RankEnvironment, OneProcessWithoutWorldSize) {
  const auto env = parse_rank_environment([](const char*) -> const char* { return nullptr; });
  EXPECT_EQ(env.world_size, 1);
  EXPECT_FALSE(env.distributed());
}

TEST(RankEnvironment, ReadsTorchrunsVariables) {
  const std::map<std::string, std::string> vars{
      {"WORLD_SIZE", "4"}, {"RANK", "3"},         {"LOCAL_RANK", "1"},
      {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"},
      {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  const auto env = parse_rank_environment([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "10.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_TRUE(env.use_agent_store);
}

TEST(RankEnvironment, BadVariablesAreNamed) {
  const auto error_with = [](std::map<std::string, std::string> vars) {
    return testing::error_of([&] {
      parse_rank_environment([&](const char* name) -> const char* {
        const auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
      });
    });
  };
  EXPECT_EQ(error_with({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"}})
                .rfind("MASTER_PORT: not set", 0),
            0U);
  EXPECT_EQ(error_with({{"WORLD_SIZE", "2"}, {"RANK", "2"}, {"MASTER_ADDR", "h"},
                        {"MASTER_PORT", "1"}})
                .rfind("RANK: 2 is not below WORLD_SIZE 2", 0),
            0U);
  EXPECT_EQ(error_with({{"WORLD_SIZE", "two"}}).rfind("WORLD_SIZE:", 0), 0U);
  EXPECT_EQ(error_with({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_ADDR", "h"},
                        {"MASTER_PORT", "70000"}})
                .rfind("MASTER_PORT: 70000", 0),
            0U);
}

TEST(RankEnvironment, ARankTrainsOnItsLocalGpuWhereItExistsElseOnTheOneItSees) {
  RankEnvironment env;
  env.rank = 3;
  env.world_size = 4;
  env.local_rank = 1;
  env.local_world_size = 2;
  std::string note;
  EXPECT_EQ(rank_gpu(env, 2, &note), 1);
  EXPECT_EQ(note, "");
  // One GPU visible per rank (CUDA_VISIBLE_DEVICES): cuda:0, said once.
  EXPECT_EQ(rank_gpu(env, 1, &note), 0);
  EXPECT_NE(note.find("rank 3: LOCAL_RANK 1 but this process sees 1 GPU(s): training on cuda:0"),
            std::string::npos)
      << note;
  EXPECT_EQ(note.find('\n'), std::string::npos);
}

TEST(RankEnvironment, TwoRanksOnOneGpuAreToldNcclNeedsOneEach) {
  RankEnvironment env;
  env.rank = 1;
  env.local_world_size = 2;
  const std::string nccl =
      "NCCL error in: ProcessGroupNCCL.cpp:2046, invalid usage, NCCL version 2.27.5\n"
      "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
      "Last error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000";
  const std::string message = shared_gpu_message(env, nccl);
  EXPECT_EQ(message.rfind("rank 1: NCCL needs one GPU per rank", 0), 0U) << message;
  EXPECT_NE(message.find("CUDA_VISIBLE_DEVICES"), std::string::npos);
  EXPECT_EQ(message.find('\n'), std::string::npos);
  EXPECT_EQ(shared_gpu_message(env, "Connection refused"), "");
}

TEST(DataParallel, ShardsSplitEveryLogicalBatchWithoutOverlap) {
  std::vector<int64_t> batch{7, 3, 9, 1, 4, 8};
  EXPECT_EQ(shard_batch(batch, 0, 2), (std::vector<int64_t>{7, 3, 9}));
  EXPECT_EQ(shard_batch(batch, 1, 2), (std::vector<int64_t>{1, 4, 8}));
  EXPECT_EQ(shard_batch(batch, 2, 3), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(shard_range(10, 0, 3), (std::pair<int64_t, int64_t>{0, 4}));
  EXPECT_EQ(shard_range(10, 1, 3), (std::pair<int64_t, int64_t>{4, 7}));
  EXPECT_EQ(shard_range(10, 2, 3), (std::pair<int64_t, int64_t>{7, 10}));
}

TEST(DataParallel, OneProcessNeedsNoCommunicator) {
  DataParallel dp;
  EXPECT_EQ(dp.world_size(), 1);
  EXPECT_EQ(dp.sum(5), 5);
  const auto outcome = dp.share_step(true, at::Tensor(), c10::Device(c10::kCPU));
  EXPECT_TRUE(outcome.out_of_memory);
}

/// Rank 0 of two, the other rank scripted: its status in the agreement
/// before the gradients (0 ready, 1 no room for the buckets, 2 no room for
/// its gradients) and gradients equal to this rank's.
class ScriptedPeer final : public Communicator {
 public:
  explicit ScriptedPeer(int peer_status) : peer_status_(peer_status) {}
  int64_t rank() const override { return 0; }
  int64_t world_size() const override { return 2; }
  std::string backend() const override { return "scripted"; }
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    calls.push_back(op == ReduceOp::kMax ? "agree" : "in place");
    if (op == ReduceOp::kMax) {
      tensor.clamp_min_(peer_status_);
    } else {
      tensor.mul_(2);
    }
  }
  std::unique_ptr<PendingCollective> start_all_reduce_sum(at::Tensor& tensor) override {
    calls.push_back("bucket");
    tensor.mul_(2);
    struct Done final : PendingCollective {
      void wait() override {}
    };
    return std::make_unique<Done>();
  }
  void broadcast(std::vector<at::Tensor>&, int64_t) override {}
  void report_failure(const std::string&) override {}
  std::vector<std::string> calls;

 private:
  int peer_status_;
};

/// Two parameters with gradients 1..n, made under `memory`'s budget.
std::vector<at::Tensor> graded_parameters() {
  std::vector<at::Tensor> params = {torch::zeros({256, 256}).requires_grad_(),
                                    torch::zeros({256}).requires_grad_()};
  for (auto& p : params) p.mutable_grad() = torch::arange(p.numel()).to(torch::kFloat).view_as(p);
  return params;
}

TEST(DataParallel, AveragingAgreesBeforeSendingAndFallsBackInPlace) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  {  // Every rank ready: one agreement, then the buckets.
    ScriptedPeer peer(0);
    DataParallel dp(&peer);
    auto params = graded_parameters();
    dp.average_gradients(params, memory.get());
    EXPECT_EQ(peer.calls, (std::vector<std::string>{"agree", "bucket"}));
    EXPECT_EQ(params[0].grad()[1][3].item<float>(), 256 + 3);  // (g + g) / 2
    EXPECT_EQ(dp.in_place_averages(), 0);
  }
  {  // The other rank had no room for its buckets: in place, gradient by gradient.
    ScriptedPeer peer(1);
    DataParallel dp(&peer);
    auto params = graded_parameters();
    dp.average_gradients(params, memory.get());
    EXPECT_EQ(peer.calls, (std::vector<std::string>{"agree", "in place", "in place"}));
    EXPECT_EQ(params[0].grad()[1][3].item<float>(), 256 + 3);
    EXPECT_EQ(params[1].grad()[7].item<float>(), 7);
    EXPECT_EQ(dp.in_place_averages(), 1);
  }
  {  // The other rank could not make its gradients: this rank stops too, at once.
    ScriptedPeer peer(2);
    DataParallel dp(&peer);
    auto params = graded_parameters();
    const std::string error = testing::error_of([&] { dp.average_gradients(params, memory.get()); });
    EXPECT_NE(error.find("out of memory making the gradients to average (on another rank)"),
              std::string::npos)
        << error;
    EXPECT_EQ(peer.calls, (std::vector<std::string>{"agree"}));
  }
}

TEST(DataParallel, NoRoomForTheBucketsOnThisRankMakesEveryRankAverageInPlace) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  auto params = graded_parameters();
  // Room for the agreement, not for a 257 KiB copy of the gradients.
  memory->release_cached();
  memory->set_usable_bytes(memory->live_bytes() + 64 * 1024);
  const int64_t ooms = memory->oom_count();
  ScriptedPeer peer(0);
  DataParallel dp(&peer);
  dp.average_gradients(params, memory.get());
  memory->set_usable_bytes(memory->capacity_bytes());
  EXPECT_GT(memory->oom_count(), ooms);
  EXPECT_EQ(peer.calls, (std::vector<std::string>{"agree", "in place", "in place"}));
  EXPECT_EQ(params[0].grad()[1][3].item<float>(), 256 + 3);
  EXPECT_EQ(dp.in_place_averages(), 1);
}

TEST(DataParallel, APlanForTwoProcessesNeedsTwo) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto data = toy_data({12}, kSamples, 4, 5);
  Workload w = ddp_workload();
  Trainer trainer(w, *memory, ddp_plan(2), *data, nullptr, TrainOptions().steps(1));
  EXPECT_NE(testing::error_of([&] { trainer.run(); }).find("world_size 2 but this job has 1"),
            std::string::npos);
}

TEST(DataParallel, TheRanksMeasureTheNoiseAtEveryStepAndNoStepIsSplit) {
  // No accumulation (a micro-batch of 16 per rank): one process would split
  // step 0 in halves to measure the noise; two ranks measure every step.
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto data = toy_data({12}, kSamples, 4, 5);
  for (const bool adapt : {false, true}) {
    Workload w = ddp_workload();
    const Plan plan = make_plan(
        PlanOptions().micro_batch_size(16).target_batch(32).world_size(2).optimizer("sgd"));
    ASSERT_EQ(plan.accumulation_steps, 1);
    Trainer trainer(w, *memory, plan, *data, nullptr,
                    TrainOptions().steps(3).adapt(adapt).adapt_options(
                        AdaptOptions().every(100)));
    ScriptedPeer peer(0);
    trainer.set_communicator(&peer);
    trainer.run();
    trainer.noise_scale().noise_scale();  // reads what is queued
    EXPECT_EQ(trainer.noise_scale().estimator().measurements(), 3) << "adapt " << adapt;
  }
}

TEST(DataParallel, TwoRanksMatchOneProcessOnTheWholeBatchAndSeeEachSampleOnce) {
  if (!distributed_backend_compiled()) GTEST_SKIP() << "no c10d backend in this build";
  const std::string dir = fresh_dir("equal");
  std::string output;
  const LaunchResult result = run_ranks(dir, "train", true, &output);
  ASSERT_EQ(result.exit_code, 0) << result.message << "\n" << output;
  const at::Tensor p0 = load_tensors(dir + "/params0");
  const at::Tensor p1 = load_tensors(dir + "/params1");
  ASSERT_GT(p0.numel(), 0) << output;
  EXPECT_TRUE(at::equal(p0, p1)) << "ranks differ by " << (p0 - p1).abs().max().item<double>();

  // One process on the concatenated batches: the same parameters.
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto data = toy_data({12}, kSamples, 4, 5);
  Workload w = ddp_workload();
  Trainer single(w, *memory, ddp_plan(1), *data, nullptr, TrainOptions().steps(kSteps).seed(3));
  single.run();
  std::vector<at::Tensor> flat;
  for (const auto& p : w.model().parameters()) flat.push_back(p.detach().reshape({-1}));
  const at::Tensor reference = at::cat(flat);
  EXPECT_TRUE(at::allclose(p0, reference, 1e-4, 1e-6))
      << "max difference " << (p0 - reference).abs().max().item<double>();

  // The epoch: each sample on exactly one rank; the 5 left over on none.
  std::map<int64_t, int> count;
  for (const char* file : {"/seen0", "/seen1"}) {
    std::istringstream in(read_text(dir + file));
    for (int64_t i; in >> i;) ++count[i];
  }
  EXPECT_EQ(count.size(), static_cast<size_t>(kSamples - 5));
  for (const auto& [index, n] : count) EXPECT_EQ(n, 1) << "sample " << index;
  const auto s0 = nlohmann::json::parse(read_text(dir + "/summary0"));
  EXPECT_EQ(s0["world_size"], 2);
  EXPECT_EQ(s0["samples"], 16 * kSteps);
}

TEST(DataParallel, AnOutOfMemoryOnOneRankShrinksBoth) {
  if (!distributed_backend_compiled()) GTEST_SKIP() << "no c10d backend in this build";
  const std::string dir = fresh_dir("oom");
  std::string output;
  const LaunchResult result = run_ranks(dir, "oom", true, &output);
  ASSERT_EQ(result.exit_code, 0) << result.message << "\n" << output;
  const auto s0 = nlohmann::json::parse(read_text(dir + "/summary0"));
  const auto s1 = nlohmann::json::parse(read_text(dir + "/summary1"));
  for (const auto& s : {s0, s1}) {
    EXPECT_GE(s["oom_recoveries"].get<int64_t>(), 1) << s.dump();
    EXPECT_LT(s["micro_batch_size"].get<int64_t>(), 32) << s.dump();
    EXPECT_EQ(s["steps"], kSteps);
  }
  EXPECT_EQ(s0["micro_batch_size"], s1["micro_batch_size"]);
  EXPECT_TRUE(at::equal(load_tensors(dir + "/params0"), load_tensors(dir + "/params1")));
}

TEST(DataParallel, ADeadRankMakesTheOtherFailNamingIt) {
  if (!distributed_backend_compiled()) GTEST_SKIP() << "no c10d backend in this build";
  const std::string dir = fresh_dir("dead");
  std::string output;
  // Rank 0 gives up by itself, at its --timeout at the latest; the guard
  // only ends a hang, far beyond that.
  testing::HangGuard guard(kWorkerTimeoutMs / 1000 * 12, "a dead rank's peer");
  const LaunchResult result = run_ranks(dir, "die", false, &output);
  EXPECT_NE(result.exit_code, 0);
  EXPECT_EQ(result.failed_rank, 1) << result.message;
  const std::string error = read_text(dir + "/error0");
  EXPECT_NE(error.find("rank 1"), std::string::npos) << error << "\n" << output;
  EXPECT_NE(error.find("rank 0: a collective failed"), std::string::npos) << error;
}

TEST(DataParallel, WhenRankZeroDiesTheOtherSaysSoWithoutStackTraces) {
  if (!distributed_backend_compiled()) GTEST_SKIP() << "no c10d backend in this build";
  const std::string dir = fresh_dir("dead0");
  std::string output;
  const LaunchResult result = run_ranks(dir, "die0", false, &output);
  EXPECT_NE(result.exit_code, 0);
  const std::string error = read_text(dir + "/error1");
  EXPECT_NE(error.find("rank 0"), std::string::npos) << error << "\n" << output;
  EXPECT_EQ(error.find("frame #"), std::string::npos) << error;
  EXPECT_EQ(output.find("frame #"), std::string::npos) << output;
  EXPECT_EQ(output.find("[c10d]"), std::string::npos) << output;
}

TEST(LaunchCli, TwoRanksTrainOneJobWithOneResult) {
  if (!distributed_backend_compiled()) GTEST_SKIP() << "no c10d backend in this build";
  const std::string json = ::testing::TempDir() + "batchtune_launch_" +
                           std::to_string(::getpid()) + ".json";
  const auto r = batchtune::testing::run_cli(
      "launch --nproc 2 -- train --model mlp --input 12 --classes 4 --steps 3 --batch-size 8 "
      "--amp off --timeout 30 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0 of 2 (gloo"), std::string::npos) << r.output;
  const auto summary = nlohmann::json::parse(read_text(json));
  EXPECT_EQ(summary["world_size"], 2);
  EXPECT_EQ(summary["global_batch_size"], 16);
  EXPECT_EQ(summary["steps"], 3);
}

TEST(LaunchCli, TwoRanksAdaptOneScheduleAndMeasureTheNoiseAcrossRanks) {
  if (!distributed_backend_compiled()) GTEST_SKIP() << "no c10d backend in this build";
  const std::string json = ::testing::TempDir() + "batchtune_launch_adapt_" +
                           std::to_string(::getpid()) + ".json";
  const auto r = batchtune::testing::run_cli(
      "launch --nproc 2 -- train --model mlp --input 12 --classes 4 --steps 60 --batch-size 8 "
      "--adapt --adapt-every 10 --amp off --timeout 30 --log-every 0 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto summary = nlohmann::json::parse(read_text(json));
  EXPECT_EQ(summary["world_size"], 2);
  // Every step compares a rank's gradient with the all-reduced one.
  EXPECT_TRUE(summary["noise_scale"].is_number()) << r.output;
  const auto& schedule = summary["batch_schedule"];
  ASSERT_GE(schedule.size(), 1U);
  EXPECT_EQ(schedule[0]["global_batch_size"], 16);
  for (const auto& change : schedule) {
    EXPECT_EQ(change["micro_batch_size"].get<int64_t>() *
                  change["accumulation_steps"].get<int64_t>() * 2,
              change["global_batch_size"].get<int64_t>());
  }
  EXPECT_EQ(summary["global_batch_size"], schedule.back()["global_batch_size"]);
  // Both ranks trained every step at rank 0's batch: the job ended together.
  EXPECT_EQ(summary["steps"], 60);
}

TEST(LaunchCli, AFailingRankFailsTheLaunch) {
  if (!distributed_backend_compiled()) GTEST_SKIP() << "no c10d backend in this build";
  const auto r = batchtune::testing::run_cli("launch --nproc 2 -- train --batch-size 0");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--batch-size"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("batchtune launch: rank"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace batchtune

namespace batchtune {
namespace {

TEST(LaunchCli, TorchrunNoPythonRunsTheRanks) {
  if (!distributed_backend_compiled()) GTEST_SKIP() << "no c10d backend in this build";
  const std::string torchrun = BATCHTUNE_TORCHRUN_PATH;
  if (torchrun.empty()) GTEST_SKIP() << "no torchrun next to the build's Python";
  const std::string json = ::testing::TempDir() + "batchtune_torchrun_" +
                           std::to_string(::getpid()) + ".json";
  // torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True):
  // both ranks connect to it as clients.
  const std::string command =
      fmt::format("{} --nproc_per_node=2 --master_port {} --no-python {} train --model mlp "
                  "--input 12 --classes 4 --steps 3 --batch-size 8 --amp off --timeout 30 "
                  "--json {} 2>&1",
                  torchrun, free_tcp_port(), BATCHTUNE_CLI_PATH, json);
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  const int status = pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  const auto summary = nlohmann::json::parse(read_text(json));
  EXPECT_EQ(summary["world_size"], 2);
  EXPECT_EQ(summary["global_batch_size"], 16);
}

}  // namespace
}  // namespace batchtune

// ---- Signals, bad stores, bounds (issue 20). ----

namespace batchtune {
namespace {

/// A TCP listener on 127.0.0.1 that never accepts nor answers: the kernel
/// completes the handshakes, nobody speaks the store's protocol.
struct SilentListener {
  SilentListener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::listen(fd, 64);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
  }
  ~SilentListener() { ::close(fd); }
  int fd = -1;
  int port = 0;
};

std::string lonely_rank(int port, const std::string& timeout) {
  return fmt::format("env WORLD_SIZE=2 RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT={} {} train "
                     "--model mlp --input 12 --classes 4 --steps 3 --batch-size 8 --amp off "
                     "--timeout {}",
                     port, BATCHTUNE_CLI_PATH, timeout);
}

RankEnvironment lonely_environment(int port) {
  RankEnvironment env;
  env.rank = 1;
  env.world_size = 2;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  return env;
}

TEST(Rendezvous, AListenerThatIsNotAStoreIsGivenUpAtTheTimeoutAndItsGrace) {
  if (!distributed_backend_compiled()) GTEST_SKIP() << "no c10d backend in this build";
  SilentListener listener;
  testing::FakeClock clock(100);
  try {
    make_communicator(lonely_environment(listener.port), c10::Device(c10::kCPU),
                      std::chrono::seconds(600), clock);
    FAIL() << "no store answered, yet a communicator came";
  } catch (const RankFailure& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format(
                  "rank 1: no rendezvous with the store at 127.0.0.1:{} within 600 s",
                  listener.port)),
              std::string::npos)
        << e.what();
  }
  // --timeout, then a second of grace for TCPStore's own error, on the clock.
  EXPECT_DOUBLE_EQ(clock.now_s(), 100 + 600 + 1);
  for (const double deadline : clock.deadlines()) EXPECT_LE(deadline, 100 + 600 + 1);
}

TEST(Rendezvous, AnInterruptEndsTheWaitAtOnce) {
  if (!distributed_backend_compiled()) GTEST_SKIP() << "no c10d backend in this build";
  SilentListener listener;
  testing::FakeClock clock(100);
  {
    InterruptHandler interrupts;
    request_interrupt(SIGTERM);
    EXPECT_THROW(make_communicator(lonely_environment(listener.port), c10::Device(c10::kCPU),
                                   std::chrono::seconds(600), clock),
                 Interrupted);
  }
  InterruptHandler fresh;  // clears the request for the tests after this one
  EXPECT_EQ(clock.now_s(), 100) << "no wait at all";
}

TEST(Rendezvous, TheWaitLooksForAnInterruptEveryPollAndEndsAtItsDeadline) {
  testing::FakeClock clock(10);
  std::mutex mutex;
  std::condition_variable wake;
  std::unique_lock<std::mutex> lock(mutex);
  EXPECT_FALSE(wait_polling_interrupts(clock, 10.25, 0.1, wake, lock, [] { return false; }));
  const std::vector<double> waits = clock.deadlines();
  ASSERT_EQ(waits.size(), 3u);
  EXPECT_DOUBLE_EQ(waits[0], 10.1);
  EXPECT_DOUBLE_EQ(waits[1], 10.2);
  EXPECT_DOUBLE_EQ(waits[2], 10.25) << "the last wait ends at the deadline, not after it";
  EXPECT_DOUBLE_EQ(clock.now_s(), 10.25);
  int looks = 0;
  EXPECT_TRUE(wait_polling_interrupts(clock, 20, 0.1, wake, lock, [&] { return ++looks > 3; }));
  EXPECT_DOUBLE_EQ(clock.now_s(), 10.25 + 0.1 * 1) << "done at the look after the first wait";
}

TEST(DistributedCli, AListenerThatIsNotAStoreFailsNamingIt) {
  if (!distributed_backend_compiled()) GTEST_SKIP() << "no c10d backend in this build";
  SilentListener listener;
  // `timeout` is the hang guard: the rank gives up by itself after its
  // --timeout and the grace (see Rendezvous above), far inside it.
  FILE* pipe = popen(("timeout -s KILL 120 " + lonely_rank(listener.port, "2") + " 2>&1").c_str(),
                     "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  const int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status << "\n" << output;
  EXPECT_NE(output.find("no rendezvous with the store"), std::string::npos) << output;
  EXPECT_NE(output.find("within 2 s"), std::string::npos) << output;
  EXPECT_EQ(output.find("frame #"), std::string::npos) << output;
}

/// Waits (in real time, at most `guard_s`: a hang guard) until a client
/// connected to `listener`; its connection, which nobody answers, or -1.
int accept_one(const SilentListener& listener, int guard_s) {
  pollfd p{listener.fd, POLLIN, 0};
  if (::poll(&p, 1, guard_s * 1000) != 1) return -1;
  return ::accept(listener.fd, nullptr, nullptr);
}

TEST(DistributedCli, ARankWaitingForAStoreHonoursSigterm) {
  if (!distributed_backend_compiled()) GTEST_SKIP() << "no c10d backend in this build";
  SilentListener listener;
  const pid_t pid = fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    dup2(null, STDOUT_FILENO);
    dup2(null, STDERR_FILENO);
    execl("/bin/sh", "sh", "-c", ("exec " + lonely_rank(listener.port, "600")).c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  // The rank has reached the store: it is in the rendezvous, its
  // interrupt handler in place.
  const int connection = accept_one(listener, 120);
  if (connection < 0) ::kill(pid, SIGKILL);
  ASSERT_GE(connection, 0) << "the rank never connected";
  ::kill(pid, SIGTERM);
  // Only the interrupt ends the wait with 143: --timeout 600 would end it
  // with 1, and the hang guard (SIGKILL after 120 s) with a signal.
  int status = 0;
  testing::HangGuard guard(120, "a rank told to stop", pid);
  ::waitpid(pid, &status, 0);
  ::close(connection);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 143) << status;
}

TEST(DistributedCli, ALonelyRankSaysSoInAFewLines) {
  if (!distributed_backend_compiled()) GTEST_SKIP() << "no c10d backend in this build";
  const int port = free_tcp_port();  // nobody listens there
  FILE* pipe = popen((lonely_rank(port, "2") + " 2>&1").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  pclose(pipe);
  EXPECT_NE(output.find("no rendezvous with the store"), std::string::npos) << output;
  EXPECT_LE(std::count(output.begin(), output.end(), '\n'), 3) << output;
  EXPECT_EQ(output.find("frame #"), std::string::npos) << output;
}

TEST(LaunchCli, SigtermReachesEveryRankAndTheLauncherWaits) {
  if (!distributed_backend_compiled()) GTEST_SKIP() << "no c10d backend in this build";
  const std::string dir = fresh_dir("sigterm_launch");
  const std::string json = dir + "/summary.json";
  std::remove(json.c_str());
  std::remove((dir + "/checkpoint.pt").c_str());
  const auto r = batchtune::testing::run_cli_and_signal(
      "launch --nproc 2 -- train --model mlp --input 12 --classes 4 --steps 1000000 "
      "--batch-size 8 --amp off --timeout 30 --log-every 20 --checkpoint " + dir +
          " --json " + json,
      "step 20/", SIGTERM);
  ASSERT_EQ(r.exit_code, 143) << r.output;
  EXPECT_NE(r.output.find("SIGTERM: passed on to the 2 rank(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stopped early by SIGTERM"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("killed by signal"), std::string::npos) << r.output;
  // Written before the launcher returned: it waited for its ranks.
  const auto summary = nlohmann::json::parse(read_text(json));
  EXPECT_EQ(summary["complete"], false);
  EXPECT_EQ(summary["interrupted_by"], "SIGTERM");
  EXPECT_EQ(summary["world_size"], 2);
  struct stat st {};
  EXPECT_EQ(::stat((dir + "/checkpoint.pt").c_str(), &st), 0) << r.output;
}

int open_fds() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (::readdir(d) != nullptr) ++n;
  ::closedir(d);
  return n - 3;  // ".", ".." and the directory's own fd
}

TEST(Launch, ALaunchThatCannotStartEveryRankStopsThoseItStarted) {
  const std::string dir = fresh_dir("fd_limit");
  const std::string pids = dir + "/pids";
  std::remove(pids.c_str());
  rlimit before{};
  ::getrlimit(RLIMIT_NOFILE, &before);
  rlimit tight = before;
  tight.rlim_cur = static_cast<rlim_t>(open_fds() + 8);  // room for a few ranks' pipes
  ::setrlimit(RLIMIT_NOFILE, &tight);
  // Ranks that would run for a day, most ignoring SIGTERM: only SIGKILL,
  // after the grace on the launcher's clock, ends those.
  testing::FakeClock clock(1000);
  testing::HangGuard guard(120, "a launch that cannot start its ranks");
  std::string message;
  int64_t started = 0;
  try {
    std::ostringstream out;
    launch(LaunchOptions()
               .nproc(50)
               .program("/bin/sh")
               .args({"-c", "trap '' TERM; echo $$ >> " + pids + "; exec sleep 86400"})
               .grace_s(30)
               .clock(&clock),
           out);
  } catch (const Error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_NOFILE, &before);
  EXPECT_NE(message.find("cannot start rank"), std::string::npos) << message;
  EXPECT_NE(message.find("Too many open files"), std::string::npos) << message;
  const size_t stopped = message.find("stopped the ");
  ASSERT_NE(stopped, std::string::npos) << message;
  started = std::stoll(message.substr(stopped + 12));
  EXPECT_GE(started, 1) << message;
  // A rank that set its trap in time is killed at the first look after the
  // grace (looks every 0.02 s of the launcher's clock); none waits longer.
  EXPECT_LE(clock.now_s(), 1000 + 30.0 + 0.02 + 1e-9);
  std::ifstream in(pids);
  int alive = 0, seen = 0;
  for (pid_t pid; in >> pid;) {
    ++seen;
    if (::kill(pid, 0) == 0) ++alive;
  }
  EXPECT_LE(seen, started);
  EXPECT_EQ(alive, 0) << "of " << seen << " started";
}

TEST(Launch, BoundsOnTheNumberOfRanks) {
  const auto r = batchtune::testing::run_cli("launch --nproc 5000 -- train");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--nproc"), std::string::npos) << r.output;
  const auto lookup = [](std::map<std::string, std::string> vars) {
    return [vars](const char* name) -> const char* {
      const auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  };
  const std::string world = testing::error_of([&] {
    parse_rank_environment(lookup({{"WORLD_SIZE", "4294967298"}, {"RANK", "0"},
                                   {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}}));
  });
  EXPECT_NE(world.find("WORLD_SIZE"), std::string::npos) << world;
}

TEST(Launch, MasterTakesIpv6InBrackets) {
  EXPECT_EQ(parse_master("[::1]:29500", "--master"), std::make_pair(std::string("::1"), 29500));
  EXPECT_EQ(parse_master("10.0.0.1:29500", "--master"),
            std::make_pair(std::string("10.0.0.1"), 29500));
  for (const char* bad : {"::1:29500", "[::1]", "[::1]29500", "[]:29500"}) {
    const std::string message = testing::error_of([&] { parse_master(bad, "--master"); });
    EXPECT_NE(message.find("--master"), std::string::npos) << bad << ": " << message;
  }
}

TEST(LaunchCli, TwoRanksOverIpv6Loopback) {
  if (!distributed_backend_compiled()) GTEST_SKIP() << "no c10d backend in this build";
  const auto r = batchtune::testing::run_cli(
      fmt::format("launch --nproc 2 --master [::1]:{} -- train --model mlp --input 12 "
                  "--classes 4 --steps 2 --batch-size 8 --amp off --timeout 30",
                  free_tcp_port()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace batchtune
