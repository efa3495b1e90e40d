#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "batchtune/tuning/tune.h"

namespace batchtune {

/// The JSON of `batchtune tune --json`: the search's fields (`max_batch_size`,
/// `search`, `trials`) and `sweep`, `chosen_batch_size`, `objective`,
/// `diagnosis`, `complete`, `energy_note`; with `--objective goodput`
/// `noise_scale`, `noise_scale_run` and `goodput`; with `energy`, `eta` and
/// `energy_cost`.
nlohmann::json to_json(const TuneResult& report);

/// The sweep as a console table, the chosen row marked, then the reason and
/// the diagnosis.
void print_sweep(std::ostream& out, const TuneResult& report);
/// The length phase: its trials (batch, length, peak), the memory model, its
/// checks and the token budget with its buckets.
void print_lengths(std::ostream& out, const TokenBudgetResult& tokens);

/// The goodput candidates as a console table, the chosen one marked.
void print_goodput(std::ostream& out, const TuneResult& report);

/// One self-contained HTML page (inline SVG, no scripts) to send a
/// colleague: the verdict (or that the run was interrupted), the plan,
/// throughput with its spread as error bars, memory against the capacity and
/// the usable limit with the failed trials, GFLOP/s, utilization over the
/// run with the batch that ran shaded, the sweep and search-trial tables, and
/// the command line, batchtune's version and the date.
std::string html_report(const TuneResult& report);

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
