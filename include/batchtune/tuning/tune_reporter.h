#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "batchtune/step/trial.h"
#include "batchtune/tuning/tune_result.h"

namespace batchtune {

/// What a tune reports as it goes: each phase as it starts, each trial as it
/// finishes. Console, JSON and HTML reporters implement it; so can a test or
/// the Python package.
class TuneReporter {
 public:
  virtual ~TuneReporter() = default;
  /// A phase begins; `what` says what it will do ("timing 8 batch sizes up to 200").
  virtual void phase_started(TunePhase phase, const std::string& what) {
    (void)phase;
    (void)what;
  }
  /// A trial at `batch_size` is about to run.
  virtual void trial_started(TunePhase phase, int64_t batch_size) {
    (void)phase;
    (void)batch_size;
  }
  /// A trial ended; `index` counts the phase's trials from 0.
  virtual void trial_finished(TunePhase phase, const TrialResult& trial, size_t index) {
    (void)phase;
    (void)trial;
    (void)index;
  }
  /// A phase ended; `result` holds what it found.
  virtual void phase_finished(TunePhase phase, const TuneResult& result) {
    (void)phase;
    (void)result;
  }
  /// The run ended (complete or not).
  virtual void finished(const TuneResult& result) { (void)result; }
};

}  // namespace batchtune
