// The tune's choice of the micro-batch: the sweep that times batch sizes up
// to the largest that fits, the choice over its rows (with the energy note
// and the diagnosis), and for goodput the noise run that sets the global
// batch. Without a sweep, the largest batch that fits.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "batchtune/data/dataset.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/monitoring/monitor.h"
#include "batchtune/monitoring/sampler.h"
#include "tune_objectives.h"
#include "tune_pipeline.h"

namespace batchtune {

void TunePipeline::sweep() {
  const double seconds = budget_.begin_phase(kSweepBudgetShare);
  // A target batch: the divisors a plan may reach it with are timed early.
  const int64_t world = planned_world_size();
  const int64_t target = options_.plan().target_batch.value_or(0);
  const std::vector<int64_t> grid = sweep_order(
      result_.search.max_batch_size, target > 0 && target % world == 0 ? target / world : 0);
  reporter_.phase_started(TunePhase::kSweep,
                          fmt::format("timing {} batch sizes up to {} (at most {:.0f} s)",
                                      grid.size(), result_.search.max_batch_size, seconds));
  size_t index = 0;
  SweepOptions sweep_options;
  sweep_options.clock = &decisions_;
  sweep_options.deadline_s = decisions_.now_s() + seconds;
  sweep_options.objective = options_.objective();
  sweep_options.tolerance = options_.tolerance();
  const SweepOutcome outcome = run_sweep(
      [&](const TrialOptions& o) {
        TrialResult t = trial(TunePhase::kSweep, o);
        swept_.push_back(t);
        reporter_.trial_finished(TunePhase::kSweep, t, index++);
        return t;
      },
      grid, result_.search.trials, sweep_options);
  result_.sweep = outcome.rows;
  if (outcome.sizes_left_out > 0) {
    sweep_note_ = fmt::format("the sweep's share of the time budget ({:.0f} s) ran out: {} of "
                              "{} sizes timed",
                              seconds, result_.sweep.size(), grid.size());
  }
  if (outcome.remeasure_rounds > 0) {
    remeasure_note_ = fmt::format("the contenders were re-measured, interleaved, {} time(s)",
                                  outcome.remeasure_rounds);
  }
  if (const auto flops = subject_.flops_per_sample()) {
    result_.peak_flops = device_peak_flops(memory_.device(), result_.amp, &result_.mfu_note);
    add_flops(result_.sweep, *flops, result_.peak_flops ? result_.peak_flops->flops_per_s : 0);
  } else {
    result_.mfu_note = "the model's FLOPs are not known";
  }
  // The sweep's phase ends in choose(), once its rows are read: the
  // console shows the table with the choice and the diagnosis.
}

void TunePipeline::choose() {
  TuneResult& r = result_;
  if (r.sweep.empty()) {
    end_phase(TunePhase::kSweep);
    return;
  }
  const bool plain = r.objective == Objective::kThroughput || r.objective == Objective::kMaxFit;
  r.selection = select_batch(r.sweep, plain ? r.objective : Objective::kThroughput,
                             options_.tolerance());
  if (!remeasure_note_.empty()) r.selection.reason += "; " + remeasure_note_;
  if (!sweep_note_.empty()) r.selection.reason += "; " + sweep_note_;
  const std::string sampler_reason =
      options_.monitor() != nullptr ? options_.monitor()->sampler().unavailable_reason()
                                    : "no monitor";
  apply_energy(r, options_.eta(), sampler_reason);
  r.diagnosis = diagnose(r.sweep, r.selection, options_.tolerance());
  // A batch that the max-batch option capped says nothing of memory or precision.
  const bool bounded =
      r.diagnosis.kind == "small-batch-bound" || r.diagnosis.kind == "memory-bound";
  if (r.search.hit_max_batch && bounded) {
    r.diagnosis = {"max-batch-bound",
                   fmt::format("max-batch-bound: the search stopped at {0}, the {1} cap, "
                               "before memory ran out; raise {1} to try larger batches",
                               options_.search().max_batch(), name(Option::kMaxBatch))};
  }
  end_phase(TunePhase::kSweep);
}

/// For goodput, once the sweep chose: the noise scale measured near the
/// choice sets the global batch the plan takes.
void TunePipeline::noise() {
  TuneResult& r = result_;
  if (r.sweep.empty() || r.objective != Objective::kGoodput) return;
  const double seconds = budget_.begin_phase(kNoiseBudgetShare);
  check_stop();
  const Dataset* data = options_.data();
  if (!subject_.runs_noise()) {
    throw OptionError(Option::kObjective,
                      "goodput: needs the workload's own training loop (a C++ Workload)");
  }
  if (data == nullptr) {
    throw OptionError(Option::kObjective,
                      "goodput: needs float inputs to train on; use " + mention(Option::kData));
  }
  reporter_.phase_started(TunePhase::kNoise,
                          fmt::format("noise scale: training {} steps on {} (at most {:.0f} s)",
                                      options_.noise_steps(), data->describe(), seconds));
  goodput_global_batch_ = apply_goodput(r, options_, subject_, memory_, *data, seconds);
  end_phase(TunePhase::kNoise);
  check_stop();
}

/// No sweep (`TuneOptions::sweep` false): the plan at the largest batch that fits.
void TunePipeline::take_the_largest() {
  result_.selection = {result_.search.max_batch_size, "the largest batch that fits (no sweep)",
                       1.0, {}};
}

}  // namespace batchtune
