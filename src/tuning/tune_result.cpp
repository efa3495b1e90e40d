#include "batchtune/tuning/tune_result.h"

#include <algorithm>
#include <map>

#include "partial_results.h"

namespace batchtune {

std::string to_string(TunePhase phase) {
  switch (phase) {
    case TunePhase::kPrecision: return "precision";
    case TunePhase::kSearch: return "search";
    case TunePhase::kLengths: return "lengths";
    case TunePhase::kSweep: return "sweep";
    case TunePhase::kNoise: return "noise";
    case TunePhase::kEval: return "eval";
    case TunePhase::kLoader: return "loader";
    case TunePhase::kPlan: return "plan";
  }
  return "?";
}

void keep_partial_results(TuneResult& result, const std::vector<TrialResult>& searched,
                          const std::vector<TrialResult>& swept, SearchStrategy strategy,
                          const std::string& why) {
  result.complete = false;
  result.interrupted_by = why;
  if (result.search.trials.empty()) {  // stopped during the search
    result.search.strategy = strategy;
    result.search.trials = searched;
    for (const auto& t : searched) {
      if (t.fits) result.search.max_batch_size = std::max(result.search.max_batch_size, t.batch_size);
      result.search.steps += t.steps_run;
    }
    result.search.stop_reason = "interrupted by " + why;
  }
  if (result.sweep.empty()) {
    // The last timing of each size wins, as in a finished sweep.
    std::map<int64_t, SweepRow> rows;
    for (const auto& t : swept) {
      if (t.fits) rows[t.batch_size] = sweep_row(t);
    }
    for (const auto& [batch, row] : rows) result.sweep.push_back(row);
  }
}

}  // namespace batchtune
