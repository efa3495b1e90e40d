// Checkpoints of a training run (see checkpoint.h): the trainer hands over its
// position, its plan, the `--adapt` state, and the summary once the run is
// finished; a resume reads them back, or refuses another run's.
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

namespace batchtune {

RunIdentity Trainer::run_identity() const {
  RunIdentity id;
  id.model = workload_.model().describe();
  id.input = describe(workload_.input_spec());
  id.optimizer = workload_.options().optimizer();
  id.amp = amp_name(plan_.amp);
  id.world_size = start_plan_.world_size;
  id.global_batch_size = start_plan_.global_batch_size;
  id.train_size = train_.size();
  id.seed = options_.seed();
  id.lr = start_plan_.lr;
  id.warmup_steps = start_plan_.warmup_steps;
  return id;
}

void Trainer::save_checkpoint(const std::optional<TrainSummary>& summary) {
  if (data_parallel_.rank() != 0) return;  // one job, one checkpoint
  CheckpointRecord record;
  record.identity = run_identity();
  record.position = {step_, epoch_, batch_in_epoch_, samples_, oom_recoveries_};
  record.plan = plan_;
  record.summary = summary;
  if (adapter_) {
    nlohmann::json schedule = nlohmann::json::array();
    for (const auto& change : schedule_) schedule.push_back(to_json(change));
    record.adapt = nlohmann::json{{"batch_schedule", schedule},
                                  {"policy", adapter_->state()},
                                  {"noise", training_step_.noise_scale().estimator().state()},
                                  {"lr_ramp_from", ramp_.from},
                                  {"lr_ramp_start", ramp_.start}};
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
  const CheckpointPosition& p = record->position;
  step_ = p.step;
  epoch_ = p.epoch;
  batch_in_epoch_ = p.batch_in_epoch;
  samples_ = p.samples;
  oom_recoveries_ = p.oom_recoveries;
  const std::string path = options_.checkpoint_dir() + "/" + kCheckpointFile;
  if (record->adapt && !adapter_) {
    throw OptionError(Option::kResume,
                      fmt::format("{} was written by an {} run (its global batch changed as it "
                                  "went); resume it with {}",
                                  path, mention(Option::kAdapt), mention(Option::kAdapt)));
  }
  if (record->adapt) {
    try {
      const nlohmann::json& adapt = *record->adapt;
      schedule_.clear();
      for (const auto& entry : adapt.at("batch_schedule")) {
        schedule_.push_back(batch_change_from_json(entry));
        if (schedule_.size() > 1) cursor_.change(schedule_.back().step, schedule_.back().global_batch_size);
      }
      adapter_->load_state(adapt.at("policy"));
      training_step_.noise_scale().estimator().load_state(adapt.at("noise"));
      ramp_.from = adapt.at("lr_ramp_from").get<double>();
      ramp_.start = adapt.at("lr_ramp_start").get<int64_t>();
      if (record->successive) {
        // Onto the device, counted as the training's memory.
        SuccessiveGradients::State state = *record->successive;
        const c10::Device device = memory_.device();
        for (at::Tensor& t : state.previous) {
          if (t.defined()) t = t.to(device).clone();
        }
        state.sq_norm = state.sq_norm.to(device).clone();
        if (state.loss_scale.defined()) state.loss_scale = state.loss_scale.to(device).clone();
        training_step_.successive().load_state(std::move(state));
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw OptionError(Option::kResume,
                        fmt::format("{} has an unreadable {} state ({}); start afresh in another "
                                    "{} directory",
                                    path, mention(Option::kAdapt), first_line(e.what()),
                                    mention(Option::kCheckpoint)));
    }
    // The plan as it stood: the schedule's batch and lr, any smaller
    // micro-batch an out-of-memory forced.
    plan_.global_batch_size = record->plan.global_batch_size;
    plan_.micro_batch_size = record->plan.micro_batch_size;
    plan_.accumulation_steps = record->plan.accumulation_steps;
    plan_.lr = record->plan.lr;
    training_step_.set_micro_batch_size(plan_.micro_batch_size);
  } else if (record->plan.micro_batch_size < plan_.micro_batch_size) {
    // Keep the smaller micro-batch an earlier out-of-memory forced.
    plan_.micro_batch_size = record->plan.micro_batch_size;
    plan_.accumulation_steps = ceil_div(plan_.global_batch_size, plan_.micro_batch_size);
    training_step_.set_micro_batch_size(plan_.micro_batch_size);
  }
  loaded_ = true;
  if (record->summary) return record->summary;
  return std::nullopt;
}

std::optional<TrainSummary> Trainer::resume() {
  const std::optional<TrainSummary> finished = load_checkpoint();
  // A run that stopped at its target is finished too.
  const bool at_target = finished && finished->target_reached;
  if (loaded_ && (step_ >= total_steps_ || at_target)) {
    // Nothing left to train: a finished run's summary as it was, never a
    // summary of zero steps over it.
    if (!finished) {
      throw OptionError(Option::kResume,
                        fmt::format("{}/{} is at step {}, past the {} steps of this run; ask "
                                    "for more {} or {}",
                                    options_.checkpoint_dir(), kCheckpointFile, step_,
                                    total_steps_, mention(Option::kSteps),
                                    mention(Option::kEpochs)));
    }
    emit(TrainEvent::Kind::kResumed,
         fmt::format("the run in {} is already finished (step {} of {}{}): nothing to "
                     "train; its summary follows",
                     options_.checkpoint_dir(), step_, total_steps_,
                     at_target ? ", stopped at its target" : ""));
    // Exports a kill cut short before the last checkpoint are made again
    // from the weights it holds.
    if (data_parallel_.rank() == 0) write_model_exports(options_.checkpoint_dir(), workload_.model());
    TrainSummary s = *finished;
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
         fmt::format("resumed from {}/{} at step {} (epoch {}, batch {} of it)",
                     options_.checkpoint_dir(), kCheckpointFile, step_, epoch_ + 1,
                     batch_in_epoch_));
  }
  return std::nullopt;
}

}  // namespace batchtune
