// The trainer's events (see `TrainEvent`): the position, the plan as it
// stands, memory, and the speed since the last event of the same kind.
#include "batchtune/training/trainer.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "batchtune/memory/device_memory.h"

namespace batchtune {

void Trainer::emit(TrainEvent::Kind kind, const std::string& message) {
  if (!callback_) return;
  TrainEvent e;
  e.kind = kind;
  e.step = step_;
  e.total_steps = total_steps_.value_or(0);
  e.epoch = epoch_;
  // Epochs the run will touch: as asked, or where its last step falls; 0
  // where only the end tells (text by steps: a step groups tokens).
  if (options_.steps() == 0) {
    e.epochs = options_.epochs();
  } else if (source_->steps_in(1)) {
    e.epochs = source_->epoch_at(options_.steps() - 1) + 1;
  }
  e.lr = scheduled_lr(lr_at(std::max<int64_t>(step_ - 1, 0)), plan_.warmup_steps,
                      std::max<int64_t>(step_ - 1, 0));
  e.micro_batch_size = plan_.micro_batch_size;
  e.accumulation_steps = plan_.accumulation_steps;
  e.memory_used_bytes = memory_.live_bytes();
  e.memory_peak_bytes = memory_.peak_bytes();
  e.memory_capacity_bytes = memory_.capacity_bytes();
  e.message = message;
  if (kind == TrainEvent::Kind::kEpochEnd || kind == TrainEvent::Kind::kEvaluation) {
    e.test_accuracy = test_accuracy_;
  }
  Mark* mark = kind == TrainEvent::Kind::kLog        ? &log_mark_
               : kind == TrainEvent::Kind::kProgress ? &progress_mark_
                                                     : nullptr;
  if (mark != nullptr) {
    const double seconds = train_seconds_ - mark->train_seconds;
    if (seconds > 0) {
      e.samples_per_s = static_cast<double>(run_samples_ - mark->samples) / seconds;
      e.busy_fraction = 1.0 - (data_seconds_ - mark->data_seconds) / seconds;
    }
    *mark = {train_seconds_, data_seconds_, run_samples_};
  }
  if (run_samples_ > 0 && train_seconds_ > 0 && total_steps_) {
    const double steps_per_s = static_cast<double>(step_ - resumed_from_step_) / train_seconds_;
    if (steps_per_s > 0) e.eta_s = static_cast<double>(*total_steps_ - step_) / steps_per_s;
  }
  if (kind == TrainEvent::Kind::kLog && window_steps_ > 0) {
    e.loss = window_loss_.item<double>() / static_cast<double>(window_steps_);
    window_loss_ = at::Tensor();
    window_steps_ = 0;
  } else if (last_loss_tensor_.defined()) {
    e.loss = last_loss_tensor_.item<double>();
  }
  if (kind == TrainEvent::Kind::kLog) {
    e.noise_scale = read_noise_scale(training_step_.noise_scale().estimator()).noise_scale;
    source_->describe(e, train_seconds_);
  }
  if (kind == TrainEvent::Kind::kBatchChange) {
    e.noise_scale = training_step_.noise_scale().noise_scale();
  }
  if (utilization_ && (kind == TrainEvent::Kind::kLog || kind == TrainEvent::Kind::kProgress)) {
    e.utilization = utilization_();
  }
  callback_(e);
}

}  // namespace batchtune
