// The tune's searches for the largest batch that fits: the training
// micro-batch, the token budget over a length range, and the evaluation
// batch (forward only).
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "batchtune/common/error.h"
#include "batchtune/common/size.h"
#include "batchtune/data/dataset.h"
#include "batchtune/distributed/data_parallel.h"
#include "batchtune/memory/device_memory.h"
#include "tune_pipeline.h"

namespace batchtune {
namespace {

// Search trials: one untimed step (it allocates the optimizer state, which
// must be counted) and one timed step.
constexpr int64_t kSearchWarmupSteps = 1;
constexpr int64_t kSearchTimedSteps = 1;

/// Bad input, not a result: the workload does not fit at all. Says how much
/// the smallest batch tried needed.
std::string no_fit_message(const SearchResult& search, const DeviceMemory& memory, double margin) {
  const auto smallest = std::min_element(
      search.trials.begin(), search.trials.end(),
      [](const TrialResult& a, const TrialResult& b) { return a.batch_size < b.batch_size; });
  std::string needed = fmt::format("its peak reached {}", format_bytes(smallest->peak_bytes));
  if (!smallest->error.empty()) needed += ": " + first_line(smallest->error);
  return fmt::format(
      "not even batch {} fits in the {} usable ({} capacity less the {:.0f} % margin); {}; give a "
      "larger {}, a smaller {} or a smaller model",
      smallest->batch_size, format_bytes(memory.usable_bytes()),
      format_bytes(memory.capacity_bytes()), 100 * margin, needed, mention(Option::kMemoryLimit),
      mention(Option::kMargin));
}

}  // namespace

void TunePipeline::search() {
  SearchOptions search = options_.search();
  // Its whole share, even when the precision phase overran its own on a
  // loaded machine (see `Budget::begin_phase`; the overrun is then said in
  // `budget_note`). Under --search-only the search is the whole run: it gets all the
  // precision phase left, not the share it has beside the later phases.
  const double share =
      options_.search_only() ? 1.0 - kPrecisionBudgetShare : kSearchBudgetShare;
  const double seconds = budget_.begin_phase(share);
  search.time_budget_s(seconds);
  // No micro-batch larger than the training data.
  const Dataset* data = options_.data();
  if (data != nullptr && !data->synthetic()) {
    search.max_batch(std::min(search.max_batch(), data->size()));
  }
  reporter_.phase_started(TunePhase::kSearch,
                          fmt::format("searching the largest batch that fits ({}, at most {:.0f} s)",
                                      to_string(search.strategy()), seconds));
  SearchResult found = search_max_batch(
      [&](int64_t batch) {
        return trial(TunePhase::kSearch, TrialOptions()
                                             .batch_size(batch)
                                             .steps(kSearchTimedSteps)
                                             .warmup_steps(kSearchWarmupSteps)
                                             .keep_fragmentation_reserve(true));
      },
      search, decisions_,
      [&](const TrialResult& t, size_t index) {
        searched_.push_back(t);
        reporter_.trial_finished(TunePhase::kSearch, t, index);
      });
  if (DataParallel* dp = group()) {
    // The job's largest micro-batch is the smallest rank's: each rank
    // searched alone (no collective inside a trial, so an out-of-memory
    // never leaves a rank waiting), and the minimum counts every one.
    own_max_batch_ = found.max_batch_size;
    result_.rank_max_batch_size = own_max_batch_;
    found.max_batch_size = dp->min(found.max_batch_size);
  }
  // Not even batch 1 fitting is bad input, not a result: said before any table.
  if (found.max_batch_size < 1 && !found.trials.empty()) {
    throw OptionError(Option::kMemoryLimit, no_fit_message(found, memory_, result_.margin));
  }
  result_.search = std::move(found);
  end_phase(TunePhase::kSearch);
}

/// A length range: the search measured at the longest length; trials at
/// shorter ones fit the memory model, and the token budget is planned and
/// checked. Within what the search's share left.
void TunePipeline::lengths() {
  const auto range = subject_.length_range();
  if (!range) return;
  budget_.begin_phase(0);
  reporter_.phase_started(
      TunePhase::kLengths,
      fmt::format("lengths {}..{}: peak memory against batch x length, for a token budget",
                  range->min, range->max));
  size_t index = 0;
  // A trial measures one micro-batch from no gradients; accumulating a
  // step's micro-batches holds the gradients of those before (one copy
  // of the parameters), so the budget is planned without them.
  const int64_t gradient_reserve = subject_.gradient_bytes();
  result_.tokens = plan_token_budget(
      [&](int64_t batch, int64_t length) {
        TrialResult t = trial(TunePhase::kLengths, TrialOptions()
                                                       .batch_size(batch)
                                                       .sequence_length(length)
                                                       .steps(kSearchTimedSteps)
                                                       .warmup_steps(kSearchWarmupSteps)
                                                       .keep_fragmentation_reserve(true));
        reporter_.trial_finished(TunePhase::kLengths, t, index++);
        return t;
      },
      result_.search.trials, result_.search.max_batch_size, *range,
      memory_.usable_bytes() - gradient_reserve, options_.search().max_batch());
  result_.tokens->reason += fmt::format(
      "; {} kept free for the gradients held while micro-batches accumulate",
      format_bytes(gradient_reserve));
  end_phase(TunePhase::kLengths);
}

/// The evaluation batch: the largest forward-only batch that fits, found by
/// the same search, from the chosen micro-batch's precision.
void TunePipeline::evaluation() {
  TuneResult& r = result_;
  const double seconds = budget_.begin_phase(kEvalBudgetShare);
  if (r.selection.batch_size < 1 || seconds <= 0) return;  // the budget is spent
  ForwardOnlyScope forward_only(runner_->subject());
  if (!forward_only.supported()) return;
  check_stop();
  SearchOptions search = options_.search();
  search.time_budget_s(seconds);
  reporter_.phase_started(TunePhase::kEval,
                          fmt::format("searching the largest evaluation batch (forward only, at "
                                      "most {:.0f} s)",
                                      seconds));
  SearchResult found = search_max_batch(
      [&](int64_t batch) {
        return trial(TunePhase::kEval, TrialOptions()
                                           .batch_size(batch)
                                           .steps(1)
                                           .warmup_steps(0)
                                           .keep_fragmentation_reserve(true));
      },
      search, decisions_,
      [&](const TrialResult& t, size_t index) {
        reporter_.trial_finished(TunePhase::kEval, t, index);
      });
  if (DataParallel* dp = group()) found.max_batch_size = dp->min(found.max_batch_size);
  r.eval_search = std::move(found);
  end_phase(TunePhase::kEval);
}

}  // namespace batchtune
