// The trainer's side of `--adapt` (see batch_adapter.h): the window timed,
// rank 0's decision shared, the change applied by the step source, and the
// lr ramped to its new value.
#include "batchtune/training/trainer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <tuple>

#include "batchtune/memory/budget_allocator.h"
#include "batchtune/memory/device_memory.h"

namespace batchtune {

double Trainer::lr_at(int64_t step) const {
  return ramp_.at(step, plan_.lr);
}

bool Trainer::adapt_batch() {
  settle_clock();
  adapter_->end_window(source_->global_batch(), train_seconds_, source_->progress());
  // Never a decision on a loss that is not finite: its noise scale is
  // frozen at the last finite measurement.
  watch_loss();
  std::optional<BatchChange> change;
  if (data_parallel_.rank() == 0 && loss_watch_->finite()) {
    change = adapter_->decide(step_, source_->global_batch(),
                              training_step_.noise_scale().estimator());
  }
  if (data_parallel_.distributed()) {
    // Rank 0 decides for all (the ranks' noise estimates differ a little).
    BudgetAllocator::UncountedScope uncounted;
    at::Tensor decided = at::tensor(
        {change ? static_cast<double>(change->global_batch_size) : 0.0, change ? change->lr : 0.0,
         change && change->noise_scale ? *change->noise_scale : 0.0},
        at::TensorOptions().dtype(at::kDouble)).to(memory_.device());
    data_parallel_.broadcast_from_first({decided});
    decided = decided.cpu();
    const double* d = decided.data_ptr<double>();
    if (data_parallel_.rank() != 0 && d[0] > 0) {
      BatchChange c;
      c.step = step_;
      c.global_batch_size = static_cast<int64_t>(d[0]);
      std::tie(c.micro_batch_size, c.accumulation_steps) = adapter_->split(c.global_batch_size);
      c.lr = d[1];
      c.noise_scale = d[2];
      c.reason = "rank 0's decision";
      change = c;
    }
  }
  if (!change) return false;
  apply_change(std::move(*change));
  return true;
}

void Trainer::apply_change(BatchChange change) {
  ramp_.restart(step_, lr_at(step_));
  plan_.lr = change.lr;
  const std::string message = source_->resize(change, training_step_);
  schedule_.push_back(change);
  emit(TrainEvent::Kind::kBatchChange,
       fmt::format("{}, lr {:.3g} over {} steps: {}", message, change.lr, kAdaptLrRampSteps,
                   change.reason));
}

}  // namespace batchtune
