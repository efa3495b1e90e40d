#pragma once

// The tune's pipeline, one phase a file: the sequence and what the phases
// share (tune.cpp), the precision (tune_precision.cpp), the searches for the
// largest batch, by length and forward only (tune_search.cpp), the sweep, the
// choice and the goodput noise run (tune_sweep.cpp), the plan and the loader
// tuning (tune_plan.cpp), and the utilization readings (tune_monitor.cpp).

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/common/clock.h"
#include "batchtune/common/option.h"
#include "batchtune/tuning/tune.h"
#include "tune_budget.h"

namespace batchtune {

/// The tune: the precision first, then everything at that precision. Each
/// phase reads the options and what the phases before it put in the result.
class TunePipeline {
 public:
  TunePipeline(TuneSubject& subject, DeviceMemory& memory, const ResolvedTuneOptions& options,
           TuneReporter* reporter);
  ~TunePipeline();
  TunePipeline(const TunePipeline&) = delete;
  TunePipeline& operator=(const TunePipeline&) = delete;

  /// The phases in order; a stop request or a signal keeps what was measured.
  TuneResult run();

 private:
  // The phases, in the order `run` calls them.
  void precision();          // tune_precision.cpp
  void search();             // tune_search.cpp
  void lengths();            // tune_search.cpp
  void sweep();              // tune_sweep.cpp
  void choose();             // tune_sweep.cpp
  void noise();              // tune_sweep.cpp
  void evaluation();         // tune_search.cpp
  void take_the_largest();   // tune_sweep.cpp
  void plan();               // tune_plan.cpp
  void tune_loader_phase();  // tune_plan.cpp, inside the plan's
  int64_t token_step(PlanRequest& planned) const;  // tune_plan.cpp, the plan's tokens
  void finish_monitor();     // tune_monitor.cpp

  // What the phases share (tune.cpp).
  /// `option` as the caller's front end names it.
  std::string name(Option option) const { return option_name(option, options_.front_end()); }
  /// The processes the plan is for: the tuning group's, else the request's.
  int64_t planned_world_size() const;
  /// Throws (caught in `run`) when the stop request says so.
  void check_stop();
  /// The group for a collective between trials (null for one process); in
  /// lockstep the ranks meet first (see `Lockstep::check_between_trials`).
  DataParallel* group();
  /// In lockstep, this rank stopped (an error, a stop request, a signal)
  /// and tells its peers, once; else nothing.
  void tell_peers_of_an_error();
  /// The runner at `amp`, timing its steps on the tune's clock, its trials
  /// in lockstep where the ranks' steps communicate.
  TrialRunner& runner_at(AmpMode amp);
  /// After a trial the pipeline took from a runner itself.
  void trial_done();
  /// One trial at the resolved precision, with the monitor's readings.
  TrialResult trial(TunePhase phase, const TrialOptions& trial_options);
  void end_phase(TunePhase phase);
  /// Why the run outlasted its time budget, when it did.
  void note_budget_overrun();

  TuneSubject& subject_;
  DeviceMemory& memory_;
  TrialRunner* runner_ = nullptr;  // at the resolved precision
  std::map<TrialRunner*, const Clock*> clocks_;  // each runner's own, put back at the end
  const TuneOptions& options_;
  TuneReporter silent_;
  TuneReporter& reporter_;
  const Clock& clock_;  ///< what steps are timed on
  /// Trials in lockstep: several ranks whose steps communicate (null else).
  std::unique_ptr<Lockstep> lockstep_;
  DecisionClock decisions_;  ///< what phases decide by (see `DecisionClock`)
  Budget budget_;
  double monitor_start_s_ = 0;
  TuneResult result_;
  std::vector<TrialResult> searched_;
  std::vector<TrialResult> swept_;
  std::optional<int64_t> own_max_batch_;
  int64_t goodput_global_batch_ = 0;
  std::string sweep_note_;
  std::string remeasure_note_;
  bool met_for_the_last_time_ = false;  ///< the ranks' last collective, the plan's, is behind
};

}  // namespace batchtune
