// Data-parallel throughput on this host: one process with all the threads
// against `--nproc` ranks sharing them (batchtune::launch starts this program
// again as each rank), at the same global batch. Prints a markdown table:
// samples/s, the scaling efficiency, and the share of step time spent
// averaging gradients (Gloo all-reduce, with flattening and copy-back).
//
//   build/bench/ddp [--models convnet,resnet18] [--batch 32] [--steps 12] [--repeats 3]
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "batchtune/memory/budget_allocator.h"
#include "batchtune/data/dataset.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/distributed/distributed.h"
#include "batchtune/monitoring/environment.h"
#include "batchtune/distributed/launch.h"
#include "batchtune/training/trainer.h"
#include "batchtune/step/workload.h"

namespace {

using namespace batchtune;

constexpr int64_t kWarmupSteps = 2;
const std::vector<int64_t> kInput{3, 64, 64};

/// One rank's run: writes "samples_per_s comm_s_per_step" to BENCH_OUT (rank 0).
int run_rank(const std::string& model, int64_t batch, int64_t steps) {
  const RankEnvironment env = rank_environment();
  const char* forced = std::getenv("BENCH_THREADS");
  const int threads = forced != nullptr
                          ? std::atoi(forced)
                          : std::max(1, available_cores() / static_cast<int>(env.local_world_size));
  configure_threads(threads);
  auto comm = make_communicator(env, c10::Device(c10::kCPU), std::chrono::seconds(120));
  auto memory = make_device_memory(c10::Device(c10::kCPU), int64_t{8} << 30);
  Workload w(WorkloadOptions().model(model).input_shape(kInput).classes(10).seed(1));
  auto generator = at::make_generator<at::CPUGeneratorImpl>(2);
  const int64_t samples = batch * (steps + kWarmupSteps);
  std::vector<int64_t> sizes{samples};
  sizes.insert(sizes.end(), kInput.begin(), kInput.end());
  TensorDataset data("synthetic", at::randn(sizes, generator),
                     at::randint(10, {samples}, generator), 10);
  const Plan plan =
      make_plan(PlanOptions().micro_batch_size(batch / env.world_size).world_size(env.world_size));
  {
    Trainer warmup(w, *memory, plan, data, nullptr, TrainOptions().steps(kWarmupSteps));
    warmup.set_communicator(comm.get());
    warmup.run();
  }
  Trainer trainer(w, *memory, plan, data, nullptr, TrainOptions().steps(steps).seed(1));
  trainer.set_communicator(comm.get());
  const TrainSummary s = trainer.run();
  if (env.rank == 0) {
    std::ofstream(std::getenv("BENCH_OUT"))
        << s.samples_per_s << " " << trainer.data_parallel().communication_seconds() / steps
        << " " << s.seconds / steps << " " << threads << "\n";
  }
  return 0;
}

struct Figures {
  double samples_per_s = 0;
  double comm_s_per_step = 0;
  double step_s = 0;
  int threads = 0;
};

Figures run_job(const std::string& model, int64_t nproc, int64_t batch, int64_t steps,
                int threads = 0) {
  const std::string out = fmt::format("/tmp/batchtune_bench_ddp_{}.txt", ::getpid());
  std::vector<std::vector<std::string>> env(static_cast<size_t>(nproc),
                                            {"BENCH_OUT=" + out, "BENCH_RANK=1"});
  if (threads > 0) {
    for (auto& e : env) e.push_back("BENCH_THREADS=" + std::to_string(threads));
  }
  std::ostringstream log;
  const auto result = launch(LaunchOptions().nproc(nproc).args(
                                 {"--model", model, "--batch", std::to_string(batch), "--steps",
                                  std::to_string(steps)})
                                 .rank_env(env),
                             log);
  if (result.exit_code != 0) {
    std::cerr << log.str() << result.message << "\n";
    std::exit(1);
  }
  Figures f;
  std::ifstream(out) >> f.samples_per_s >> f.comm_s_per_step >> f.step_s >> f.threads;
  ::unlink(out.c_str());
  return f;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  BudgetAllocator::install();
  std::string models = "convnet,resnet18";
  int64_t batch = 32;
  int64_t steps = 12;
  int repeats = 3;
  int64_t nproc = 2;
  std::string model;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--models") models = value;
    if (flag == "--model") model = value;
    if (flag == "--batch") batch = std::stoll(value);
    if (flag == "--steps") steps = std::stoll(value);
    if (flag == "--repeats") repeats = std::stoi(value);
    if (flag == "--nproc") nproc = std::stoll(value);
  }
  if (std::getenv("BENCH_RANK") != nullptr) return run_rank(model, batch, steps);

  fmt::print("| model | global batch | processes x threads | samples/s (median of {}) | "
             "vs 1 x all cores | vs 1 x 1 | gradient all-reduce ms/step | share of step |\n",
             repeats);
  fmt::print("|---|---:|---|---:|---:|---:|---:|---:|\n");
  std::stringstream list(models);
  for (std::string m; std::getline(list, m, ',');) {
    // Within each repeat: one process with all the cores' threads, one
    // process with 1 thread, then the ranks; ratios are taken per repeat.
    std::vector<double> all, single, many, comm, step, ratio_all, ratio_single;
    int threads_all = 0, threads_many = 0;
    for (int r = 0; r < repeats; ++r) {
      const Figures a = run_job(m, 1, batch, steps);
      const Figures s1 = run_job(m, 1, batch, steps, 1);
      const Figures b = run_job(m, nproc, batch, steps);
      all.push_back(a.samples_per_s);
      single.push_back(s1.samples_per_s);
      many.push_back(b.samples_per_s);
      ratio_all.push_back(b.samples_per_s / a.samples_per_s);
      ratio_single.push_back(b.samples_per_s / s1.samples_per_s);
      comm.push_back(b.comm_s_per_step);
      step.push_back(b.step_s);
      threads_all = a.threads;
      threads_many = b.threads;
    }
    fmt::print("| {} 3x64x64 | {} | 1 x {} | {:.1f} | 1.00 | | 0 | 0 % |\n", m, batch, threads_all,
               median(all));
    fmt::print("| {} 3x64x64 | {} | 1 x 1 | {:.1f} | | 1.00 | 0 | 0 % |\n", m, batch,
               median(single));
    fmt::print("| {} 3x64x64 | {} | {} x {} | {:.1f} | {:.2f} | {:.2f} | {:.1f} | {:.0f} % |\n", m,
               batch, nproc, threads_many, median(many), median(ratio_all),
               median(ratio_single), median(comm) * 1e3, 100 * median(comm) / median(step));
  }
  return 0;
}
