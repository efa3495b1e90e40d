#include "batchtune/training/token_trainer.h"

#include <memory>

#include "batchtune/memory/device_memory.h"
#include "token_steps.h"

namespace batchtune {

TrainSummary train_by_tokens(Workload& workload, DeviceMemory& memory, const Plan& plan,
                             const TextDataset& data, const TokenTrainOptions& options,
                             const TrainCallback& callback,
                             const std::function<void(int64_t)>& before_step) {
  // Text has no test split; the one loop trains it over its step source.
  Trainer trainer(workload, memory, plan, /*test=*/nullptr, options.run(),
                  [&](Plan& p, DataParallel&) -> std::unique_ptr<StepSource> {
                    return std::make_unique<TokenSteps>(data, p, options, memory);
                  });
  if (callback) trainer.set_callback(callback);
  if (before_step) trainer.set_before_step(before_step);
  return trainer.run();
}

}  // namespace batchtune
