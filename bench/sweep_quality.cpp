// bench/sweep_quality: is the batch size `tune` chooses as fast as the best
// an exhaustive grid finds? For each built-in model on the CPU: the search and
// sweep as `batchtune tune` runs them, then every power of two up to the
// maximum and the maximum itself, each timed over many steps, in the same run.
//
//   build/bench/sweep_quality [--quick]
//
// Prints a markdown table (README "Benchmarks").
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "batchtune/memory/budget_allocator.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/monitoring/environment.h"
#include "batchtune/data/input_spec.h"
#include "batchtune/tuning/search.h"
#include "batchtune/common/shape.h"
#include "batchtune/common/size.h"
#include "batchtune/tuning/sweep.h"
#include "batchtune/step/workload.h"
#include "bench_workloads.h"

namespace {

using namespace batchtune;

// The exhaustive grid times each size this many steps, three times over,
// and keeps the median of the three medians.
constexpr int64_t kGridSteps = 15;
constexpr int kGridRepeats = 3;

using bench::Case;
using bench::describe;
using bench::kMiB;
using bench::workload_options;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  BudgetAllocator::install();
  configure_threads(0);
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  std::vector<Case> cases = {
      {"convnet", {3, 32, 32}, 128 * kMiB}, {"mlp", {1, 28, 28}, 32 * kMiB},
      {"lenet", {1, 28, 28}, 64 * kMiB},    {"resnet18", {3, 32, 32}, 256 * kMiB},
      {"gpt", {128}, 64 * kMiB},
  };
  if (quick) cases.resize(2);
  fmt::print("| workload | limit | max fits | chosen (confidence) | chosen samples/s | "
             "grid best (batch) | chosen / best | tune s (search + sweep) |\n"
             "|---|---|---|---|---|---|---|---|\n");
  for (const Case& c : cases) {
    auto memory = make_device_memory(c10::Device(c10::kCPU), c.limit);
    Workload workload(workload_options(c));
    TrialRunner runner(workload, *memory);
    const auto start = std::chrono::steady_clock::now();
    const SearchResult search = search_max_batch(
        [&](int64_t b) { return runner.run(TrialOptions().batch_size(b).steps(1).warmup_steps(1)); },
        SearchOptions());
    const auto rows = run_sweep([&](const TrialOptions& o) { return runner.run(o); },
                                sweep_grid(search.max_batch_size), search.trials).rows;
    const Selection chosen = select_batch(rows, Objective::kThroughput);
    const double tune_seconds = seconds_since(start);

    // The exhaustive grid, timed long, in the same run.
    double best = 0;
    int64_t best_batch = 0;
    double chosen_sps = 0;
    for (int64_t b : sweep_grid(search.max_batch_size)) {
      std::vector<double> medians;
      for (int r = 0; r < kGridRepeats; ++r) {
        medians.push_back(
            runner.run(TrialOptions().batch_size(b).steps(kGridSteps).warmup_steps(2)).samples_per_s);
      }
      const double sps = median(medians);
      if (sps > best) best = sps, best_batch = b;
      if (b == chosen.batch_size) chosen_sps = sps;
    }
    fmt::print("| {} | {} | {} | {} ({}) | {:.0f} | {:.0f} ({}) | {:.3f} | {:.1f} |\n", describe(c),
               format_bytes(c.limit), search.max_batch_size, chosen.batch_size,
               chosen.confidence ? format_level(*chosen.confidence) : "inconclusive", chosen_sps,
               best, best_batch, chosen_sps / best, tune_seconds);
    std::fflush(stdout);
  }
  return 0;
}
