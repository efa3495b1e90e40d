// The tune's first phase: the precision every trial runs at.
#include <fmt/format.h>

#include <cstdint>

#include "batchtune/distributed/data_parallel.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/monitoring/monitor.h"
#include "tune_pipeline.h"

namespace batchtune {

/// The precision every trial runs at, inside the budget: as asked, by the
/// GPU's capability, or on the CPU measured (bf16 against fp32).
void TunePipeline::precision() {
  TuneResult& r = result_;
  const double seconds = budget_.begin_phase(kPrecisionBudgetShare);
  AmpChoice choice;
  const AmpMode requested = options_.amp();
  if (const auto own = subject_.own_amp()) {
    choice = *own;
  } else if (requested != AmpMode::kAuto || memory_.device().is_cuda()) {
    choice = resolve_amp_unmeasured(requested, memory_.device(), options_.front_end());
    if (requested != AmpMode::kAuto) {
      // As asked, in the caller's words ("as asked with amp", or where the
      // value came from: "the Trainer's precision 'bf16-mixed'").
      choice.reason = fmt::format("amp {}: {}", amp_name(requested),
                                  as_asked(Option::kAmp, options_.front_end(),
                                           options_.plan().sources));
    }
  } else {
    reporter_.phase_started(
        TunePhase::kPrecision,
        fmt::format("amp auto: timing bf16 against fp32, interleaved (at most {:.0f} s)",
                    seconds));
    AmpMeasureOptions measure;
    measure.clock = &decisions_;
    measure.deadline_s = decisions_.now_s() + seconds;
    double t0 = 0;
    measure.before_trial = [&](AmpMode, int64_t batch) {
      check_stop();
      reporter_.trial_started(TunePhase::kPrecision, batch);
      if (options_.monitor() != nullptr) t0 = options_.monitor()->now_s();
    };
    size_t index = 0;
    measure.after_trial = [&](const TrialResult& t) {
      trial_done();
      if (options_.monitor() != nullptr) {
        result_.phases.push_back({t0 - monitor_start_s_,
                                  options_.monitor()->now_s() - monitor_start_s_, t.batch_size,
                                  to_string(TunePhase::kPrecision)});
      }
      reporter_.trial_finished(TunePhase::kPrecision, t, index++);
    };
    choice = measure_cpu_amp(runner_at(AmpMode::kOff), runner_at(AmpMode::kBf16), measure);
  }
  if (DataParallel* data_parallel = group()) {
    // Rank 0's precision for every rank: one job trains at one precision.
    const auto rank0 = static_cast<AmpMode>(data_parallel->min(
        data_parallel->rank() == 0 ? static_cast<int64_t>(choice.mode) : INT64_MAX));
    if (rank0 != choice.mode) {
      choice = {rank0, fmt::format("amp {}: rank 0's choice (this rank's: {})", amp_name(rank0),
                                   choice.reason),
                choice.confidence};
    }
  }
  r.amp = choice.mode;
  r.amp_reason = choice.reason;
  r.amp_confidence = choice.confidence;
  runner_ = &runner_at(choice.mode);
  r.workload = runner_->subject().describe();
  end_phase(TunePhase::kPrecision);
}

}  // namespace batchtune
