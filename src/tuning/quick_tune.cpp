#include "batchtune/tuning/quick_tune.h"

#include <fmt/format.h>

#include <algorithm>

#include "batchtune/memory/device_memory.h"
#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/step/trial.h"
#include "batchtune/step/workload.h"

namespace batchtune {

TunedBatch quick_tune(Workload& workload, DeviceMemory& memory, int64_t max_batch) {
  TrialRunner runner(workload, memory);
  TunedBatch tuned;
  tuned.search = search_max_batch(
      [&](int64_t b) {
        throw_if_interrupted();
        return runner.run(TrialOptions().batch_size(b).steps(1).warmup_steps(1));
      },
      SearchOptions()
          .max_batch(std::min(max_batch, kDefaultMaxBatch))
          .time_budget_s(kQuickTuneTimeBudgetSeconds));
  if (tuned.search.max_batch_size < 1) {
    throw Error(fmt::format(
        "--memory-limit: not even batch size 1 fits in {} usable bytes; give more memory",
        memory.usable_bytes()));
  }
  tuned.sweep = run_sweep(
      [&](const TrialOptions& o) {
        throw_if_interrupted();
        return runner.run(o);
      },
      sweep_grid(tuned.search.max_batch_size), tuned.search.trials);
  const Selection chosen = select_batch(tuned.sweep, Objective::kThroughput);
  tuned.batch_size = chosen.batch_size;
  tuned.reason = fmt::format("micro-batch {}: tuned — largest that fits {} ({}); {}",
                             chosen.batch_size, tuned.search.max_batch_size,
                             tuned.search.stop_reason, chosen.reason);
  return tuned;
}

}  // namespace batchtune
