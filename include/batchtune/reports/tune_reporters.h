#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "batchtune/tuning/tune.h"

namespace batchtune {

/// A tune for people: each phase as it starts, its table as it ends, the
/// plan, and on a terminal a progress line per trial (overwritten in place,
/// on `progress`).
///
/// Example:
/// ```
///   batchtune::ConsoleTuneReporter console(std::cout, &std::cerr);
///   auto result = batchtune::tune(workload, *memory, options, &console);
/// ```
class ConsoleTuneReporter : public TuneReporter {
 public:
  /// `progress`: where the per-trial progress line goes (a terminal); null
  /// for none.
  explicit ConsoleTuneReporter(std::ostream& out, std::ostream* progress = nullptr);
  void phase_started(TunePhase phase, const std::string& what) override;
  void trial_started(TunePhase phase, int64_t batch_size) override;
  void trial_finished(TunePhase phase, const TrialResult& trial, size_t index) override;
  void phase_finished(TunePhase phase, const TuneResult& result) override;
  void finished(const TuneResult& result) override;

 private:
  void clear_progress();
  std::ostream& out_;
  std::ostream* progress_;
  size_t trials_ = 0;
};

/// Writes a finished run's text to a sink once, at the end: the JSON of
/// `tune --json`, or the HTML report.
class FileTuneReporter : public TuneReporter {
 public:
  enum class Format { kJson, kHtml };
  FileTuneReporter(Format format, std::function<void(const std::string&)> write);
  void finished(const TuneResult& result) override;

 private:
  Format format_;
  std::function<void(const std::string&)> write_;
};

/// Passes every event on to each of several reporters, in order.
class TuneReporters : public TuneReporter {
 public:
  void add(TuneReporter* reporter) { reporters_.push_back(reporter); }
  void phase_started(TunePhase phase, const std::string& what) override;
  void trial_started(TunePhase phase, int64_t batch_size) override;
  void trial_finished(TunePhase phase, const TrialResult& trial, size_t index) override;
  void phase_finished(TunePhase phase, const TuneResult& result) override;
  void finished(const TuneResult& result) override;

 private:
  std::vector<TuneReporter*> reporters_;
};

}  // namespace batchtune
