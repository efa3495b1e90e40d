// bench/search_cost: what each search strategy costs to find the largest batch
// that fits, and how close it gets, on real CPU workloads under the emulated
// budget. The true maximum is binsearch's answer: bisection to one sample.
//
//   build/bench/search_cost [--quick]
//
// Prints a markdown table (README "Benchmarks").
#include <fmt/format.h>

#include <cstring>
#include <map>
#include <vector>

#include "batchtune/memory/budget_allocator.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/monitoring/environment.h"
#include "batchtune/data/input_spec.h"
#include "batchtune/tuning/search.h"
#include "batchtune/common/shape.h"
#include "batchtune/common/size.h"
#include "batchtune/step/workload.h"
#include "bench_workloads.h"

namespace {

using namespace batchtune;

using bench::Case;
using bench::describe;
using bench::kMiB;
using bench::workload_options;

struct Row {
  std::string strategy;
  int64_t found = 0;
  size_t trials = 0;
  int64_t steps = 0;
  double seconds = 0;
};

Row run(const Case& c, SearchStrategy strategy) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), c.limit);
  Workload workload(workload_options(c));
  TrialRunner runner(workload, *memory);
  const SearchResult r = search_max_batch(
      [&](int64_t b) { return runner.run(TrialOptions().batch_size(b).steps(1).warmup_steps(1)); },
      SearchOptions().strategy(strategy).time_budget_s(1e9));
  return {to_string(strategy), r.max_batch_size, r.trials.size(), r.steps, r.seconds};
}

}  // namespace

int main(int argc, char** argv) {
  BudgetAllocator::install();
  configure_threads(0);
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  std::vector<Case> cases = {
      {"convnet", {3, 32, 32}, 64 * kMiB},    {"convnet", {3, 64, 64}, 512 * kMiB},
      {"mlp", {1, 28, 28}, 16 * kMiB},        {"lenet", {1, 28, 28}, 64 * kMiB},
      {"lenet", {3, 64, 64}, 256 * kMiB},     {"resnet18", {3, 32, 32}, 256 * kMiB},
      {"resnet18", {3, 64, 64}, 512 * kMiB}, {"gpt", {128}, 64 * kMiB},
      {"gpt", {512}, 256 * kMiB},
  };
  if (quick) cases.resize(2);
  const SearchStrategy strategies[] = {SearchStrategy::kBinsearch, SearchStrategy::kPredict,
                                       SearchStrategy::kPower, SearchStrategy::kBackoff};
  fmt::print("| workload | limit | true max | strategy | found / true | trials | steps | seconds |\n");
  fmt::print("|---|---|---|---|---|---|---|---|\n");
  std::map<std::string, std::vector<double>> fraction, trial_ratio;
  for (const Case& c : cases) {
    int64_t truth = 0;
    size_t bins_trials = 0;
    for (SearchStrategy s : strategies) {
      const Row row = run(c, s);
      if (s == SearchStrategy::kBinsearch) {
        truth = row.found;
        bins_trials = row.trials;
      }
      const double frac = truth > 0 ? static_cast<double>(row.found) / truth : 0;
      fraction[row.strategy].push_back(frac);
      trial_ratio[row.strategy].push_back(static_cast<double>(row.trials) / bins_trials);
      fmt::print("| {} | {} | {} | {} | {:.3f} | {} | {} | {:.1f} |\n", describe(c),
                 format_bytes(c.limit), truth, row.strategy,
                 frac, row.trials, row.steps, row.seconds);
      std::fflush(stdout);
    }
  }
  fmt::print("\n| strategy | worst found / true | mean trials / binsearch trials |\n|---|---|---|\n");
  for (auto& [name, fr] : fraction) {
    double worst = 1e9;
    double mean = 0;
    for (double f : fr) worst = std::min(worst, f);
    for (double t : trial_ratio[name]) mean += t / trial_ratio[name].size();
    fmt::print("| {} | {:.3f} | {:.2f} |\n", name, worst, mean);
  }
  return 0;
}
