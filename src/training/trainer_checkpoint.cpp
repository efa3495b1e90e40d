// Checkpoints of a training run (see checkpoint.h): the trainer hands over its
// position, its plan, the `--adapt` state, the target's window and the summary
// once the run is finished, and the step source what only it keeps (text:
// the rest of the epoch and the token counts); a resume reads them back, or
// refuses another run's.
#include "batchtune/training/trainer.h"

#include "batchtune/training/checkpoint.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "batchtune/common/counts.h"
#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/data/input_spec.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/workload.h"
#include "adapt_checkpoint.h"

namespace batchtune {

RunIdentity Trainer::run_identity() const {
  RunIdentity id;
  id.model = workload_.model().describe();
  id.input = describe(workload_.input_spec());
  id.optimizer = workload_.options().optimizer();
  id.amp = amp_name(plan_.amp);
  source_->identify(id);
  id.seed = options_.seed();
  id.lr = start_plan_.lr;
  id.warmup_steps = start_plan_.warmup_steps;
  return id;
}

AdaptCheckpoint Trainer::adapt_checkpoint() {
  return {schedule_, *adapter_, training_step_.noise_scale().estimator(), ramp_};
}

void Trainer::save_checkpoint(const std::optional<TrainSummary>& summary) {
  if (data_parallel_.rank() != 0) return;  // one job, one checkpoint
  CheckpointRecord record;
  record.identity = run_identity();
  record.position = {step_, epoch_, 0, samples_, oom_recoveries_};
  record.plan = plan_;
  record.summary = summary;
  source_->save(record);
  if (loss_target_) record.loss_window = loss_target_->window();
  if (adapter_) {
    record.adapt = adapt_checkpoint().save();
    if (training_step_.successive().holding()) {
      record.successive = training_step_.successive().state();
    }
  }
  write_checkpoint(options_.checkpoint_dir(), {workload_.model(), workload_.optimizer(), training_step_.scaler()},
                   record);
  emit(TrainEvent::Kind::kCheckpoint,
       "checkpoint " + options_.checkpoint_dir() + "/" + kCheckpointFile);
}

std::optional<TrainSummary> Trainer::load_checkpoint() {
  const auto record = read_checkpoint(options_.checkpoint_dir(), run_identity(),
                                      {workload_.model(), workload_.optimizer(), training_step_.scaler()});
  if (!record) return std::nullopt;
  const std::string path = options_.checkpoint_dir() + "/" + kCheckpointFile;
  source_->check(*record, path);
  const CheckpointPosition& p = record->position;
  step_ = p.step;
  epoch_ = p.epoch;
  samples_ = p.samples;
  oom_recoveries_ = p.oom_recoveries;
  if (loss_target_) loss_target_->restore(record->loss_window);
  if (record->adapt && !adapter_) {
    throw OptionError(Option::kResume,
                      fmt::format("{} was written by an {} run (its global batch changed as it "
                                  "went); resume it with {}",
                                  path, mention(Option::kAdapt), mention(Option::kAdapt)));
  }
  if (!record->adapt && adapter_) {
    // One rule for images and text: the run's batch schedule began with it.
    throw OptionError(Option::kResume,
                      fmt::format("{} was written by a run without {}; resume it without {}",
                                  path, mention(Option::kAdapt), mention(Option::kAdapt)));
  }
  if (record->adapt) {
    adapt_checkpoint().load(*record->adapt, path);
    // Another window applies from here on (the bounds may not change: the
    // policy refuses them), and is said.
    const nlohmann::json& policy = record->adapt->at("policy");
    if (const auto every = policy.find("every");
        every != policy.end() && every->get<int64_t>() != adapter_->options().every()) {
      emit(TrainEvent::Kind::kResumed,
           fmt::format("{} {} applies from here on; the checkpoint's run decided every {} steps",
                       option_name(Option::kAdaptEvery, FrontEnd::kCli),
                       adapter_->options().every(), every->get<int64_t>()));
    }
    if (record->successive) {
      training_step_.successive().load_state(on_device(*record->successive, memory_.device()));
    }
  }
  source_->load(*record, schedule_, path);
  if (plan_.micro_batch_size >= 1) training_step_.set_micro_batch_size(plan_.micro_batch_size);
  if (adapter_) {
    if (const auto cap = source_->micro_cap()) adapter_->cap_micro_batch(*cap);
  }
  loaded_ = true;
  if (record->summary) return record->summary;
  return std::nullopt;
}

std::optional<TrainSummary> Trainer::resume() {
  const std::optional<TrainSummary> saved = load_checkpoint();
  // A run that stopped at its target is finished too.
  const bool at_target = saved && saved->target_reached;
  if (loaded_ && (finished() || at_target)) {
    // Nothing left to train: a finished run's summary as it was, never a
    // summary of zero steps over it.
    if (!saved) {
      throw OptionError(Option::kResume,
                        fmt::format("{}/{} is at step {}, past the {} of this run; ask "
                                    "for more {} or {}",
                                    options_.checkpoint_dir(), kCheckpointFile, step_,
                                    total_steps_ ? fmt::format("{} steps", *total_steps_)
                                                 : fmt::format("{} epochs", options_.epochs()),
                                    mention(Option::kSteps), mention(Option::kEpochs)));
    }
    emit(TrainEvent::Kind::kResumed,
         fmt::format("the run in {} is already finished (step {}{}{}): nothing to "
                     "train; its summary follows",
                     options_.checkpoint_dir(), step_,
                     total_steps_ ? fmt::format(" of {}", *total_steps_) : std::string(),
                     at_target ? ", stopped at its target" : ""));
    // Exports a kill cut short before the last checkpoint are made again
    // from the weights it holds.
    if (data_parallel_.rank() == 0) write_model_exports(options_.checkpoint_dir(), workload_.model());
    TrainSummary s = *saved;
    s.already_finished = true;
    return s;
  }
  if (!loaded_) {
    emit(TrainEvent::Kind::kResumed,
         fmt::format("no checkpoint in {} yet: --resume starts the run afresh",
                     options_.checkpoint_dir()));
  } else {
    total_steps_ = planned_steps();  // the changes it replayed
    resumed_from_step_ = step_;
    emit(TrainEvent::Kind::kResumed,
         fmt::format("resumed from {}/{} at step {} (epoch {}, {})", options_.checkpoint_dir(),
                     kCheckpointFile, step_, epoch_ + 1, source_->position_in_epoch(step_)));
  }
  return std::nullopt;
}

}  // namespace batchtune
