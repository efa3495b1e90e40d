// The whole tuning pipeline from C++: precision, the largest micro-batch
// that fits, the fastest, and the plan to train with, under a 256 MiB
// budget (the CPU emulates a device's memory; on a GPU it is the GPU's).
//
// Build: part of the batchtune build (examples/). Run: build/examples/tune_api
#include <batchtune/memory/budget_allocator.h>
#include <batchtune/memory/device_memory.h>
#include <batchtune/reports/train_reporter.h>
#include <batchtune/reports/tune_report.h>
#include <batchtune/step/workload.h>
#include <batchtune/tuning/tune.h>

#include <iostream>

int main() {
  batchtune::BudgetAllocator::install();
  auto memory = batchtune::make_device_memory(c10::Device(c10::kCPU), int64_t{256} << 20);
  batchtune::Workload workload(batchtune::WorkloadOptions()
                                   .model("lenet")
                                   .input_shape({1, 28, 28})
                                   .optimizer("sgd")
                                   .lr(0.05));
  batchtune::PlanRequest plan;
  plan.target_batch = 512;  // the logical batch to keep, by accumulation
  batchtune::ConsoleTuneReporter console(std::cout);
  const batchtune::TuneResult result = batchtune::tune(
      workload, *memory,
      batchtune::TuneOptions().time_budget_s(30).amp(batchtune::AmpMode::kAuto).plan(plan),
      &console);
  std::cout << "largest micro-batch that fits: " << result.search.max_batch_size << "\n"
            << "chosen: " << result.selection.batch_size << " (" << result.selection.reason
            << ")\n";
  if (result.plan) std::cout << batchtune::to_json(*result.plan).dump(2) << "\n";
  return result.plan ? 0 : 1;
}
