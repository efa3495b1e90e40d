#include "batchtune/reports/tune_reporters.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include "batchtune/reports/console_reporter.h"
#include "batchtune/reports/train_reporter.h"
#include "batchtune/reports/tune_console.h"
#include "batchtune/reports/tune_json.h"
#include "batchtune/reports/tune_page.h"

namespace batchtune {
ConsoleTuneReporter::ConsoleTuneReporter(std::ostream& out, std::ostream* progress)
    : out_(out), progress_(progress) {}

void ConsoleTuneReporter::clear_progress() {
  if (progress_ != nullptr) *progress_ << "\r\033[K" << std::flush;
}

void ConsoleTuneReporter::phase_started(TunePhase phase, const std::string& what) {
  clear_progress();
  trials_ = 0;
  switch (phase) {
    case TunePhase::kSearch:
      fmt::print(out_, "{}\n", what);
      break;
    case TunePhase::kSweep:
      fmt::print(out_, "\nsweep: {}\n", what);
      break;
    case TunePhase::kPlan:
      break;
    default:
      fmt::print(out_, "\n{}\n", what);
  }
  out_ << std::flush;  // progress for whoever reads a pipe (tee, a test)
}

void ConsoleTuneReporter::trial_started(TunePhase phase, int64_t batch_size) {
  if (progress_ == nullptr) return;
  *progress_ << fmt::format("\r\033[K{}: batch {} ...", phase == TunePhase::kSearch ? "trial"
                                                                                   : to_string(phase),
                            batch_size)
             << std::flush;
}

void ConsoleTuneReporter::trial_finished(TunePhase phase, const TrialResult& trial, size_t index) {
  (void)phase;
  ++trials_;
  if (progress_ == nullptr) return;
  *progress_ << "\r\033[K" << trial_progress_line(trial, index) << std::flush;
}

void ConsoleTuneReporter::phase_finished(TunePhase phase, const TuneResult& result) {
  clear_progress();
  switch (phase) {
    case TunePhase::kSearch:
      if (result.rank_max_batch_size) {
        fmt::print(out_, "rank 0: largest batch {} here, {} for the job (the smallest rank's)\n",
                   *result.rank_max_batch_size, result.search.max_batch_size);
      }
      print_search(out_, result.search);
      break;
    case TunePhase::kLengths:
      if (result.tokens) print_lengths(out_, *result.tokens);
      break;
    case TunePhase::kSweep:
      print_sweep(out_, result);
      break;
    case TunePhase::kNoise:
      if (result.noise && result.noise->noise_scale) {
        const NoiseScaleMeasurement& n = *result.noise;
        fmt::print(out_,
                   "noise scale {:.1f} (|G|^2 {:.4g}, tr(Sigma) {:.4g}; {} measurements of batch "
                   "{} against {}, {:.1f} s)\n",
                   *n.noise_scale, n.gradient_sq_norm.value_or(0), n.trace_covariance.value_or(0),
                   n.measurements, n.small_batch, n.big_batch, n.seconds);
      } else if (result.noise) {
        // An unresolved estimate's note says so itself, with its figures.
        fmt::print(out_, "{}{}\n", result.noise->unresolved() ? "" : "noise scale not measured: ",
                   result.noise->note);
      }
      print_goodput(out_, result);
      break;
    case TunePhase::kEval:
      if (result.eval_search) {
        fmt::print(out_, "largest evaluation batch {} in {} forward-only trial(s): {}\n",
                   result.eval_search->max_batch_size, result.eval_search->trials.size(),
                   result.eval_search->stop_reason);
      }
      break;
    case TunePhase::kLoader:
      fmt::print(out_, "{}", loader_table(result.loader));
      if (result.diagnosis.kind == "input-bound") {
        fmt::print(out_, "diagnosis: {}\n", result.diagnosis.text);
      }
      break;
    case TunePhase::kPlan:
      if (result.plan) {
        fmt::print(out_, "\n");
        print_plan(out_, *result.plan);
      }
      break;
    case TunePhase::kPrecision:
      // Said when it was measured; a mode asked for is in the plan.
      if (trials_ > 0) fmt::print(out_, "{}\n", result.amp_reason);
      break;
  }
  out_ << std::flush;
}

void ConsoleTuneReporter::finished(const TuneResult& result) {
  clear_progress();
  if (!result.complete) {
    fmt::print(out_, "\ninterrupted by {}: writing what was measured so far ({} search trial(s), "
               "{} sweep row(s)), marked incomplete\n",
               result.interrupted_by, result.search.trials.size(), result.sweep.size());
  }
  if (result.search.lower_bound) {
    fmt::print(out_,
               "the time budget stopped the search before it found the limit: {} fits, and is a "
               "lower bound (a larger batch may fit); give the tune a larger time budget\n",
               result.search.max_batch_size);
  }
  if (!result.budget_note.empty()) fmt::print(out_, "time budget: {}\n", result.budget_note);
  out_ << std::flush;
}

FileTuneReporter::FileTuneReporter(Format format, std::function<void(const std::string&)> write)
    : format_(format), write_(std::move(write)) {}

void FileTuneReporter::finished(const TuneResult& result) {
  write_(format_ == Format::kJson ? to_json(result).dump(2) + "\n" : html_report(result));
}

void TuneReporters::phase_started(TunePhase phase, const std::string& what) {
  for (auto* r : reporters_) r->phase_started(phase, what);
}
void TuneReporters::trial_started(TunePhase phase, int64_t batch_size) {
  for (auto* r : reporters_) r->trial_started(phase, batch_size);
}
void TuneReporters::trial_finished(TunePhase phase, const TrialResult& trial, size_t index) {
  for (auto* r : reporters_) r->trial_finished(phase, trial, index);
}
void TuneReporters::phase_finished(TunePhase phase, const TuneResult& result) {
  for (auto* r : reporters_) r->phase_finished(phase, result);
}
void TuneReporters::finished(const TuneResult& result) {
  for (auto* r : reporters_) r->finished(result);
}

}  // namespace batchtune
