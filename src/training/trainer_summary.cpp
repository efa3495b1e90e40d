// What a training run reports at its end (see `TrainSummary`): its position,
// the plan it ran, speed, the `--adapt` schedule and the target when one was set.
#include "batchtune/training/trainer.h"

#include "batchtune/common/interrupt.h"

namespace batchtune {

TrainSummary Trainer::summary(bool complete, bool time_limit_reached) {
  TrainSummary s;
  s.steps = step_;
  s.samples = samples_;
  s.final_loss = last_loss_;
  s.test_accuracy = test_ != nullptr ? test_accuracy_ : std::nullopt;
  s.oom_recoveries = oom_recoveries_;
  s.micro_batch_size = plan_.micro_batch_size;
  s.accumulation_steps = plan_.accumulation_steps;
  s.global_batch_size = plan_.global_batch_size;
  s.world_size = plan_.world_size;
  s.skipped_steps = training_step_.scaler().skipped_steps();
  if (training_step_.scaler().enabled()) s.loss_scale = training_step_.scaler().current_scale();
  s.seconds = train_seconds_;
  s.samples_per_s =
      train_seconds_ > 0 ? static_cast<double>(run_samples_) / train_seconds_ : 0;
  s.resumed_from_step = resumed_from_step_;
  s.complete = complete;
  s.time_limit_reached = time_limit_reached;
  if (!complete) {
    s.interrupted_by = interrupt_requested() ? interrupt_name() : "another rank's signal";
  }
  const NoiseScaleReading noise = read_noise_scale(training_step_.noise_scale().estimator());
  s.noise_scale = noise.noise_scale;
  s.noise_scale_note = noise.note;
  source_->summarize(s, train_seconds_);
  s.batch_schedule = schedule_;
  if (loss_watch_) s.divergence = loss_watch_->divergence();
  s.data_wait_fraction = train_seconds_ > 0 ? data_seconds_ / train_seconds_ : 0;
  if (options_.target_accuracy() || options_.target_loss()) {
    s.target = options_.target_accuracy()
                   ? TrainTarget{"test_accuracy", *options_.target_accuracy()}
                   : TrainTarget{"train_loss", *options_.target_loss()};
    s.target_reached = reached_.has_value();
    if (reached_) {
      s.steps_to_target = reached_->step;
      s.seconds_to_target = reached_->train_seconds;
      s.samples_to_target = reached_->samples;
    }
  }
  return s;
}

}  // namespace batchtune
