// The trainer's side of `--adapt` (see batch_adapter.h): the window timed,
// rank 0's decision shared, the change applied to the plan, the step, the
// cursor, and the lr ramped to its new value.
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
  adapter_->end_window(plan_.global_batch_size, train_seconds_, run_samples_);
  std::optional<BatchChange> change;
  if (data_parallel_.rank() == 0) {
    change = adapter_->decide(step_, plan_.global_batch_size,
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
  apply_change(*change);
  return true;
}

void Trainer::apply_change(const BatchChange& change) {
  ramp_.restart(step_, lr_at(step_));
  const int64_t before = plan_.global_batch_size;
  plan_.global_batch_size = change.global_batch_size;
  plan_.micro_batch_size = change.micro_batch_size;
  plan_.accumulation_steps = change.accumulation_steps;
  plan_.lr = change.lr;
  training_step_.set_micro_batch_size(change.micro_batch_size);
  cursor_.change(step_, change.global_batch_size);
  schedule_.push_back(change);
  emit(TrainEvent::Kind::kBatchChange,
       fmt::format("adapt: global batch {} -> {} ({} x {} per rank), lr {:.3g} over {} steps: "
                   "{}",
                   before, change.global_batch_size, change.micro_batch_size,
                   change.accumulation_steps, change.lr, kAdaptLrRampSteps, change.reason));
}

}  // namespace batchtune
