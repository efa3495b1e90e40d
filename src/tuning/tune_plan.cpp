// The tune's last phases: the plan made at the chosen micro-batch (with the
// goodput global batch, the evaluation batch, the token budget and the job's
// agreement), and inside it the loader tuning on the training data.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "batchtune/data/dataset.h"
#include "batchtune/distributed/data_parallel.h"
#include "tune_pipeline.h"

namespace batchtune {

void TunePipeline::plan() {
  TuneResult& r = result_;
  if (r.selection.batch_size < 1) return;
  PlanRequest request = options_.plan();
  request.micro_batch_size.reset();
  request.plan_file.clear();
  request.world_size = planned_world_size();
  const std::string micro_reason = micro_batch_reason(
      r.selection.batch_size, r.selection.reason, own_max_batch_, r.search.max_batch_size);
  const AmpChoice amp{r.amp, r.amp_reason};
  MicroBatchChoice micro{r.selection.batch_size, micro_reason, {}, options_.tolerance()};
  for (const SweepRow& row : r.sweep) {
    if (row.samples_per_s > 0) micro.speeds.push_back({row.batch_size, row.samples_per_s});
  }
  PlanRequest planned = request;
  if (goodput_global_batch_ > 0) planned.target_batch = goodput_global_batch_;
  const int64_t tokens_per_step = r.tokens ? token_step(planned) : 0;
  Plan plan = subject_.plan(planned, micro, amp, memory_);
  if (goodput_global_batch_ > 0) {
    plan.set_reason(PlanField::kGlobalBatch,
                    plan.accumulation_steps == 1
                        ? fmt::format("global batch {}: the goodput choice, the micro-batch itself",
                                      plan.global_batch_size)
                        : fmt::format("global batch {}: the goodput choice, {} accumulated "
                                      "micro-batches of {}",
                                      plan.global_batch_size, plan.accumulation_steps,
                                      plan.micro_batch_size));
  }
  if (r.eval_search && r.eval_search->max_batch_size > 0) {
    // Evaluation never needs less room than training: at least the micro-batch.
    plan.eval_micro_batch_size = std::max(r.eval_search->max_batch_size, plan.micro_batch_size);
    plan.set_reason(PlanField::kEvalBatch,
                    fmt::format("eval batch {}: the largest forward-only batch that fits ({}, "
                                "{})",
                                plan.eval_micro_batch_size, to_string(r.eval_search->strategy),
                                r.eval_search->stop_reason));
  }
  if (r.tokens) {
    plan.token_budget = r.tokens->token_budget;
    plan.length_buckets = r.tokens->buckets;
    plan.tokens_per_step = tokens_per_step;
    plan.set_reason(PlanField::kTokenBudget, r.tokens->reason);
  }
  // The micro-batch this rank's plan took (a smaller one may reach the
  // target exactly): the selection stays this rank's choice unless the
  // job's agreement gives another plan.
  const int64_t planned_micro = plan.micro_batch_size;
  if (DataParallel* dp = group()) plan = dp->agree_plan(plan);
  met_for_the_last_time_ = true;  // no rank waits for another after this
  if (plan.micro_batch_size != planned_micro) {
    // Data parallel: every rank swept its own device; the job trains rank 0's choice.
    r.selection.reason += fmt::format("; the job takes rank 0's micro-batch {} (this rank chose {})",
                                      plan.micro_batch_size, r.selection.batch_size);
    r.selection.batch_size = plan.micro_batch_size;
  }
  r.plan = plan;
  tune_loader_phase();
  budget_.begin_phase(0);  // the plan's own seconds, not the loader's again
  reporter_.phase_started(TunePhase::kPlan, "the plan");
  end_phase(TunePhase::kPlan);
}

/// A token budget: the real tokens of an optimizer step over every process
/// (the target batch at the data's mean length, else one budget a process),
/// and, where the mean length is known, `planned` made to aim at the samples
/// such a step holds on average, so that the lr is scaled to them.
int64_t TunePipeline::token_step(PlanRequest& planned) const {
  const int64_t budget = result_.tokens->token_budget;
  const std::optional<double> mean = planned.mean_length;
  if (!mean || !(*mean > 0)) return budget * planned.world_size;
  const bool asked = planned.target_batch.has_value();
  const int64_t tokens =
      asked ? std::max<int64_t>(1, std::llround(static_cast<double>(*planned.target_batch) * *mean))
            : budget * planned.world_size;
  const int64_t samples = std::max<int64_t>(1, std::llround(static_cast<double>(tokens) / *mean));
  planned.target_batch = samples;
  planned.sources[Option::kTargetBatch] =
      asked ? fmt::format("{} ({} tokens a step at the data's mean length {:.1f})",
                          option_name(Option::kTargetBatch, planned.front_end), tokens, *mean)
            : fmt::format("{} tokens a step ({} a process) / the data's mean length {:.1f} =",
                          tokens, budget, *mean);
  return tokens;
}

/// The worker count for the plan, timed on the training data at the
/// planned micro-batch, and the input-bound diagnosis when loading waits.
void TunePipeline::tune_loader_phase() {
  TuneResult& r = result_;
  const double seconds = budget_.begin_phase(kLoaderBudgetShare);
  const Dataset* data = options_.data();
  if (data == nullptr || !subject_.tunes_loader()) {
    r.loader = {{}, {}, subject_.loader_skipped_note()};
    return;
  }
  if (seconds <= 0) {
    r.loader = {{}, {}, "loader tuning skipped: the time budget was spent"};
    return;
  }
  check_stop();
  reporter_.phase_started(TunePhase::kLoader,
                          fmt::format("input pipeline: timing worker counts on {} (at most {:.0f} s)",
                                      data->describe(), seconds));
  Plan& plan = *r.plan;
  const auto row = std::find_if(r.sweep.begin(), r.sweep.end(), [&](const auto& s) {
    return s.batch_size == plan.micro_batch_size;
  });
  r.loader = tune_loader(*runner_, *data, std::min(plan.micro_batch_size, data->size()),
                         row != r.sweep.end() ? row->step_ms / 1000 : 0, plan.prefetch,
                         options_.seed(), std::max<int64_t>(1, options_.cores()),
                         [&] { return budget_.phase_over(); });
  end_phase(TunePhase::kLoader);
  if (r.loader.choice && !options_.plan().workers) apply_loader_choice(plan, *r.loader.choice);
  if (const auto wait = chosen_wait(r.loader); wait && *wait >= kInputBoundWait) {
    r.diagnosis = {"input-bound", input_diagnosis(*wait, r.loader.choice->workers,
                                                  kInputBoundWait, /*loader_tuned=*/true)};
  }
  check_stop();
}

}  // namespace batchtune
