// The tune as a sequence of phases (`TunePipeline::run`) and what every
// phase shares: the stop request, the runners on the tune's clock, one trial
// with the monitor's readings, the end of a phase. The phases themselves are
// in tune_precision.cpp, tune_search.cpp, tune_sweep.cpp, tune_plan.cpp and
// tune_monitor.cpp (see tune_pipeline.h).
#include "batchtune/tuning/tune.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "batchtune/common/interrupt.h"
#include "batchtune/distributed/data_parallel.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/monitoring/monitor.h"
#include "batchtune/tuning/energy.h"
#include "partial_results.h"
#include "tune_pipeline.h"

namespace batchtune {
namespace {

/// A lockstep for the trials where several ranks tune a subject whose step
/// communicates (its runners' trials must then pair up), else null.
std::unique_ptr<Lockstep> lockstep_for(TuneSubject& subject, const TuneOptions& options) {
  DataParallel* dp = options.data_parallel();
  if (dp == nullptr || !dp->distributed()) return nullptr;
  if (!subject.runner(AmpMode::kOff).subject().communicates()) return nullptr;
  return std::make_unique<Lockstep>(*dp);
}

/// Thrown inside the pipeline when the stop request says so; caught in
/// `TunePipeline::run`, which keeps what was measured.
struct Stopped {
  std::string why;
};

}  // namespace

TunePipeline::TunePipeline(TuneSubject& subject, DeviceMemory& memory,
                           const ResolvedTuneOptions& options, TuneReporter* reporter)
    : subject_(subject),
      memory_(memory),
      options_(*options),
      reporter_(reporter != nullptr ? *reporter : silent_),
      clock_(options->clock() != nullptr ? *options->clock() : steady_clock()),
      lockstep_(lockstep_for(subject, *options)),
      decisions_(clock_, lockstep_.get()),
      budget_(decisions_, options->time_budget_s()),
      monitor_start_s_(options_.monitor() != nullptr ? options_.monitor()->now_s() : 0) {}

TunePipeline::~TunePipeline() {
  for (auto& [runner, clock] : clocks_) {
    runner->set_clock(*clock);
    if (lockstep_ == nullptr) continue;
    try {
      runner->set_lockstep(nullptr);  // the subject drops it: it dies with the pipeline
    } catch (...) {
      // A subject that cannot let go holds a pointer it is never given a step to use.
    }
  }
}

TuneResult TunePipeline::run() {
  TuneResult& r = result_;
  r.device = memory_.device().str();
  r.threads = at::get_num_threads();
  r.objective = options_.objective();
  r.capacity_bytes = memory_.capacity_bytes();
  r.usable_bytes = memory_.usable_bytes();
  r.margin = subject_.own_margin().value_or(options_.margin());
  r.search_only = options_.search_only();
  r.time_budget_s = options_.time_budget_s();
  r.command_line = options_.command_line();
  try {
    precision();
    search();
    if (!r.search_only && r.search.max_batch_size > 0) {
      lengths();
      if (options_.sweep()) {
        sweep();
        choose();
        noise();
        evaluation();
      } else {
        take_the_largest();
      }
      plan();
    }
  } catch (const Stopped& stopped) {
    tell_peers_of_an_error();
    keep_partial_results(r, searched_, swept_, options_.search().strategy(), stopped.why);
  } catch (const Interrupted&) {
    // A signal inside a phase that polls it itself (the noise run, loader
    // tuning, a trial of a subject that polls): named as the stop request
    // names it (Python's KeyboardInterrupt), else as the signal.
    tell_peers_of_an_error();
    std::optional<std::string> why = options_.stop() ? options_.stop()() : std::nullopt;
    keep_partial_results(r, searched_, swept_, options_.search().strategy(),
                         why.value_or(interrupt_name()));
  } catch (const PeerFailure& peer) {
    // Learned between trials: this rank stops as its peer did.
    throw Error(peer.what());
  } catch (...) {
    tell_peers_of_an_error();
    throw;
  }
  if (r.workload.empty()) r.workload = subject_.runner(AmpMode::kOff).subject().describe();
  // The usable memory the trials were judged against: a runner made during
  // the run takes its margin off the capacity then, after the start read it.
  r.usable_bytes = r.search.trials.empty() ? memory_.usable_bytes()
                                           : r.search.trials.front().usable_bytes;
  finish_monitor();
  note_budget_overrun();
  reporter_.finished(r);
  return std::move(r);
}

void TunePipeline::note_budget_overrun() {
  TuneResult& r = result_;
  const double elapsed = budget_.elapsed_s();
  if (elapsed > r.time_budget_s * (1 + kTimeBudgetTolerance) && !r.phase_seconds.empty()) {
    const auto longest = std::max_element(
        r.phase_seconds.begin(), r.phase_seconds.end(),
        [](const auto& a, const auto& b) { return a.second < b.second; });
    r.budget_note = fmt::format(
        "the run took {:.1f} s against a time budget of {:.0f} s, the {} phase {:.1f} s of "
        "it: a trial's least measurement (its warm-up and one timed step) or a phase that is "
        "not sliced (the noise run) outlasted what was left; give a larger {}",
        elapsed, r.time_budget_s, to_string(longest->first), longest->second,
        name(Option::kTimeBudget));
  }
}

int64_t TunePipeline::planned_world_size() const {
  // Several processes tuning together plan for their group; one process
  // plans for the world size it was asked for.
  const DataParallel* dp = options_.data_parallel();
  return dp != nullptr && dp->distributed() ? dp->world_size() : options_.plan().world_size;
}

DataParallel* TunePipeline::group() {
  DataParallel* dp = options_.data_parallel();
  if (dp == nullptr || !dp->distributed()) return nullptr;
  if (lockstep_ != nullptr) lockstep_->check_between_trials();
  return dp;
}

void TunePipeline::tell_peers_of_an_error() {
  // Once, and not when the error was a peer's: each peer then stops at its
  // next meeting instead of waiting for this rank in a collective. After
  // the plan's agreement no peer meets again: nobody to tell, nobody waiting.
  if (lockstep_ != nullptr && !met_for_the_last_time_) lockstep_->fail(/*error=*/true);
}

void TunePipeline::check_stop() {
  if (!options_.stop()) return;
  if (auto why = options_.stop()()) throw Stopped{*why};
}

TrialRunner& TunePipeline::runner_at(AmpMode amp) {
  TrialRunner& runner = subject_.runner(amp);
  if (clocks_.count(&runner) == 0) {
    clocks_[&runner] = &runner.clock();
    runner.set_clock(clock_);
    if (lockstep_ != nullptr) runner.set_lockstep(lockstep_.get());
  }
  return runner;
}

void TunePipeline::trial_done() { decisions_.agree(); }

TrialResult TunePipeline::trial(TunePhase phase, const TrialOptions& trial_options) {
  check_stop();
  reporter_.trial_started(phase, trial_options.batch_size());
  const double t0 = options_.monitor() != nullptr ? options_.monitor()->now_s() : 0;
  // The runner stamps its timed window on its own clock; the monitor's
  // samples are on the monitor's.
  const double offset = t0 - runner_->clock().now_s();
  TrialResult result = runner_->run(trial_options);
  trial_done();
  if (options_.monitor() != nullptr) {
    const double t1 = options_.monitor()->now_s();
    attach_readings(*options_.monitor(), result_.device, offset, result);
    result_.phases.push_back({t0 - monitor_start_s_, t1 - monitor_start_s_,
                              trial_options.batch_size(), to_string(phase)});
  }
  return result;
}

void TunePipeline::end_phase(TunePhase phase) {
  result_.phase_seconds.emplace_back(phase, budget_.phase_seconds());
  reporter_.phase_finished(phase, result_);
}

TuneResult tune(TuneSubject& subject, DeviceMemory& memory, const ResolvedTuneOptions& options,
                TuneReporter* reporter) {
  return TunePipeline(subject, memory, options, reporter).run();
}

TuneResult tune(TuneSubject& subject, DeviceMemory& memory, const TuneOptions& options,
                TuneReporter* reporter) {
  return tune(subject, memory, resolve(options), reporter);
}

TuneResult tune(Workload& workload, DeviceMemory& memory, const TuneOptions& options,
                TuneReporter* reporter) {
  const ResolvedTuneOptions resolved = resolve(options);
  WorkloadSubject subject(workload, memory, resolved->margin());
  return tune(subject, memory, resolved, reporter);
}

TuneResult tune(const RunnerAt& runner_at, DeviceMemory& memory, const TuneOptions& options,
                TuneReporter* reporter) {
  RunnerSubject subject(runner_at);
  return tune(subject, memory, options, reporter);
}

TuneResult tune(TrialRunner& runner, const TuneOptions& options, TuneReporter* reporter) {
  RunnerSubject subject(runner);
  return tune(subject, runner.memory(), options, reporter);
}

}  // namespace batchtune
