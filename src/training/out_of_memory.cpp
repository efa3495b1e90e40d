#include "out_of_memory.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include "batchtune/common/error.h"
#include "batchtune/common/size.h"
#include "batchtune/distributed/data_parallel.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/trial_failure.h"
#include "batchtune/step/training_step.h"
#include "batchtune/step/workload.h"

namespace batchtune {

at::Tensor backward_until_it_fits(DeviceMemory& memory, TrainingStep& step,
                                  DataParallel& ranks,
                                  const std::function<at::Tensor()>& attempt,
                                  const std::function<void(const std::string& why)>& shrink) {
  for (;;) {
    std::string why;
    at::Tensor loss;
    const int64_t ooms_before = memory.oom_count();
    try {
      loss = attempt();
    } catch (const c10::Error& e) {
      if (classify_step_failure(e, ooms_before, memory.oom_count()) != StepFailure::kOutOfMemory) {
        throw;
      }
      why = first_line(e.what_without_backtrace());
      memory.release_cached();  // what the failed try held
    }
    const auto outcome = ranks.share_step(!why.empty(), loss, memory.device());
    if (!outcome.out_of_memory) return outcome.loss;
    if (why.empty()) {  // this rank fitted; another did not
      why = "another rank ran out of memory";
      loss = at::Tensor();
      step.workload().optimizer().zero_grad(/*set_to_none=*/true);
    }
    shrink(why);
  }
}

void apply_or_explain(DeviceMemory& memory, TrainingStep& training_step, double lr,
                      int64_t step) {
  const int64_t ooms_before = memory.oom_count();
  try {
    training_step.apply(lr);
  } catch (const c10::Error& e) {
    if (classify_step_failure(e, ooms_before, memory.oom_count()) != StepFailure::kOutOfMemory) {
      throw;
    }
    throw Error(fmt::format("train: out of memory in the optimizer step (step {}): {}; the "
                            "optimizer state does not fit in {}",
                            step + 1, first_line(e.what_without_backtrace()),
                            format_bytes(memory.usable_bytes())));
  }
}

}  // namespace batchtune
