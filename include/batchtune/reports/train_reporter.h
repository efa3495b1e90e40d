#pragma once

#include <nlohmann/json.hpp>

#include <ostream>

#include "batchtune/plan/plan.h"
#include "batchtune/training/train_summary_json.h"
#include "batchtune/training/trainer.h"

namespace batchtune {

// The JSON of `batchtune train --json` is `to_json(const TrainSummary&)`,
// in training/train_summary_json.h (a checkpoint stores the same).

/// A plan for people: the numbers, then one line per reason.
void print_plan(std::ostream& out, const Plan& plan);

/// The training loop's events for people: on a terminal a progress bar
/// (steps, epoch, loss, samples/s, ETA) redrawn in place; log events,
/// epoch ends, out-of-memory recoveries and checkpoints as lines.
///
/// Example:
/// ```
///   batchtune::TrainConsoleReporter reporter(std::cout, isatty(1));
///   trainer.set_callback([&](const batchtune::TrainEvent& e) { reporter.report(e); });
///   reporter.summary(trainer.run());
/// ```
class TrainConsoleReporter {
 public:
  TrainConsoleReporter(std::ostream& out, bool terminal) : out_(out), terminal_(terminal) {}
  void report(const TrainEvent& event);
  void summary(const TrainSummary& summary);

  /// The periodic line: step, loss, lr, samples/s, busy %, utilization and
  /// memory (used / peak / capacity).
  static std::string log_line(const TrainEvent& event);
  /// The progress bar's text, without the carriage return.
  static std::string progress_bar(const TrainEvent& event);

 private:
  void clear_bar();
  std::ostream& out_;
  bool terminal_;
  bool bar_shown_ = false;
};

}  // namespace batchtune
