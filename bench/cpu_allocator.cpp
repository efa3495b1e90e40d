// bench/cpu_allocator: what the budget allocator's cache of freed blocks is
// worth on the CPU. Trains each workload with the cache on (batchtune's
// default) and off (every block back to glibc, as LibTorch's own allocator
// does), alternating, and reports median samples/s of each.
//
//   build/bench/cpu_allocator
#include <fmt/format.h>

#include <vector>

#include "batchtune/memory/budget_allocator.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/monitoring/environment.h"
#include "batchtune/common/shape.h"
#include "batchtune/step/trial.h"
#include "batchtune/step/workload.h"

namespace {

using namespace batchtune;

constexpr int kRepeats = 5;
constexpr int64_t kSteps = 10;

struct Case {
  const char* model;
  std::vector<int64_t> input;
  int64_t batch;
};

}  // namespace

int main() {
  auto& budget = BudgetAllocator::install();
  const int threads = configure_threads(0);
  const std::vector<Case> cases = {{"convnet", {3, 64, 64}, 64},
                                   {"convnet", {3, 64, 64}, 256},
                                   {"resnet18", {3, 32, 32}, 64},
                                   {"mlp", {1, 28, 28}, 256}};
  fmt::print("| workload | batch | cache off samples/s | cache on samples/s | on / off |\n"
             "|---|---|---|---|---|\n");
  for (const Case& c : cases) {
    auto memory = make_device_memory(c10::Device(c10::kCPU), std::nullopt);
    Workload workload(WorkloadOptions().model(c.model).input_shape(c.input));
    TrialRunner runner(workload, *memory);
    std::vector<double> on, off;
    for (int r = 0; r < kRepeats; ++r) {
      for (bool caching : {false, true}) {
        budget.set_caching(caching);
        const TrialResult t =
            runner.run(TrialOptions().batch_size(c.batch).steps(kSteps).warmup_steps(2));
        (caching ? on : off).push_back(t.samples_per_s);
      }
    }
    budget.set_caching(true);
    const double m_on = median(on), m_off = median(off);
    fmt::print("| {} {} | {} | {:.0f} | {:.0f} | {:.2f} |\n", c.model, format_shape(c.input),
               c.batch, m_off, m_on, m_on / m_off);
    std::fflush(stdout);
  }
  fmt::print("\n{} thread(s)\n", threads);
  return 0;
}
