// Checkpoints of a token-budget run (see checkpoint.h): the weights and the
// optimizer as every run's, and under JSON `tokens` what only this run has —
// the token counts, and from its batch source (token_steps.h) the rest of the
// epoch's micro-batches and the tokens per step and budget as they stand —
// so that a resume trains the same steps on.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/data/input_spec.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/amp.h"
#include "batchtune/step/workload.h"
#include "batchtune/training/checkpoint.h"
#include "batchtune/training/model_exports.h"
#include "adapt_checkpoint.h"
#include "token_run.h"

namespace batchtune {
RunIdentity TokenRun::run_identity() const {
  RunIdentity id;
  id.model = workload_.model().describe();
  id.input = describe(workload_.input_spec());
  id.optimizer = workload_.options().optimizer();
  id.amp = amp_name(plan_.amp);
  id.world_size = 1;
  // Fixed batches: their samples; a token budget: the plan's tokens.
  id.global_batch_size = fixed_ ? options_.fixed_batch_size() : plan_.token_budget;
  id.train_size = static_cast<int64_t>(lengths_.size());
  id.seed = run_.seed();
  id.lr = plan_.lr;
  id.warmup_steps = plan_.warmup_steps;
  return id;
}

AdaptCheckpoint TokenRun::adapt_checkpoint() {
  return {summary_.batch_schedule, *adapter_, step_.noise_scale().estimator(), ramp_};
}

void TokenRun::save_checkpoint(const std::optional<TrainSummary>& summary) {
  CheckpointRecord record;
  record.identity = run_identity();
  record.position = {summary_.steps, epoch_, static_cast<int64_t>(source_->position()),
                     summary_.samples, summary_.oom_recoveries};
  record.plan = plan_;
  record.summary = summary;
  nlohmann::json tokens{{"target_tokens_given", options_.target_tokens()},
                        {"lr", lr_},
                        {"tokens", summary_.tokens},
                        {"padded_tokens", summary_.padded_tokens},
                        {"micro_batches", summary_.micro_batches},
                        {"epoch_samples", epoch_samples_},
                        {"final_loss", summary_.final_loss}};
  source_->save(tokens);  // the tokens per step, the budget, the rest of the epoch
  record.tokens = std::move(tokens);
  if (loss_target_) record.loss_window = loss_target_->window();
  if (adapter_) {
    record.adapt = adapt_checkpoint().save();
    if (step_.successive().holding()) record.successive = step_.successive().state();
  }
  write_checkpoint(run_.checkpoint_dir(),
                   {workload_.model(), workload_.optimizer(), step_.scaler()}, record);
  TrainEvent event;
  event.kind = TrainEvent::Kind::kCheckpoint;
  event.step = summary_.steps;
  event.epoch = epoch_;
  event.message = "checkpoint " + run_.checkpoint_dir() + "/" + kCheckpointFile;
  emit(event);
}

std::optional<TrainSummary> TokenRun::resume() {
  const std::string& dir = run_.checkpoint_dir();
  const std::string path = dir + "/" + kCheckpointFile;
  const auto record = read_checkpoint(dir, run_identity(),
                                      {workload_.model(), workload_.optimizer(), step_.scaler()});
  TrainEvent event;
  event.kind = TrainEvent::Kind::kResumed;
  if (!record) {
    event.message = fmt::format("no checkpoint in {} yet: {} starts the run afresh", dir,
                                mention(Option::kResume));
    emit(event);
    return std::nullopt;
  }
  if (!record->tokens) {
    throw OptionError(Option::kResume,
                      fmt::format("{} was written by a run on images, not text by a token "
                                  "budget; give another {} DIR to start afresh",
                                  path, mention(Option::kCheckpoint)));
  }
  if (record->adapt.has_value() != adapter_.has_value()) {
    throw OptionError(Option::kResume,
                      fmt::format("{} was written by a run {} {}; resume it {} {}", path,
                                  record->adapt ? "with" : "without", mention(Option::kAdapt),
                                  record->adapt ? "with" : "without", mention(Option::kAdapt)));
  }
  const nlohmann::json& t = *record->tokens;
  try {
    const int64_t given = t.at("target_tokens_given").get<int64_t>();
    if (given != options_.target_tokens()) {
      throw OptionError(Option::kResume,
                        fmt::format("{} was written by a run with {} {}, this one has {}; resume "
                                    "with the same {}",
                                    path, mention(Option::kTargetTokens), given,
                                    options_.target_tokens(), mention(Option::kTargetTokens)));
    }
    source_->load(t);
    lr_ = t.at("lr").get<double>();
    summary_.tokens = t.at("tokens").get<int64_t>();
    summary_.padded_tokens = t.at("padded_tokens").get<int64_t>();
    summary_.micro_batches = t.at("micro_batches").get<int64_t>();
    summary_.final_loss = t.at("final_loss").get<double>();
    epoch_samples_ = t.at("epoch_samples").get<int64_t>();
    if (loss_target_) {
      // Checkpoints before the window was every run's keep it under `tokens`.
      loss_target_->restore(t.contains("loss_window")
                                ? t.at("loss_window").get<std::vector<double>>()
                                : record->loss_window);
    }
    resumed_ = true;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw OptionError(Option::kResume,
                      fmt::format("{} has an unreadable token state ({}); give another {} DIR to "
                                  "start afresh",
                                  path, first_line(e.what()), mention(Option::kCheckpoint)));
  }
  if (adapter_) {
    adapt_checkpoint().load(*record->adapt, path);
    adapter_->cap_micro_batch(source_->cap());
    if (record->successive) {
      step_.successive().load_state(on_device(*record->successive, memory_.device()));
    }
  }
  const CheckpointPosition& p = record->position;
  summary_.steps = p.step;
  summary_.samples = p.samples;
  summary_.oom_recoveries = p.oom_recoveries;
  summary_.resumed_from_step = p.step;
  epoch_ = p.epoch;
  summary_.epochs = static_cast<double>(epoch_) +
                    static_cast<double>(epoch_samples_) / static_cast<double>(lengths_.size());
  // A finished run, unless this one asks for more steps or epochs.
  const bool finished =
      record->summary &&
      (record->summary->target_reached ||
       (run_.steps() > 0 ? p.step >= run_.steps()
                         : record->summary->epochs >= static_cast<double>(run_.epochs())));
  if (finished) {
    event.message = fmt::format("the run in {} is already finished (step {}): nothing to "
                                "train; its summary follows",
                                dir, p.step);
    emit(event);
    // Exports a kill cut short before the last checkpoint are made again.
    write_model_exports(dir, workload_.model());
    TrainSummary s = *record->summary;
    s.already_finished = true;
    return s;
  }
  event.step = p.step;
  event.epoch = p.epoch;
  event.message = fmt::format("resumed from {} at step {} (epoch {}, micro-batch {} of it)", path,
                              p.step, p.epoch + 1, p.batch_in_epoch);
  emit(event);
  return std::nullopt;
}

}  // namespace batchtune
