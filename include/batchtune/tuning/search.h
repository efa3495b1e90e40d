#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/common/clock.h"
#include "batchtune/common/option.h"
#include "batchtune/step/trial.h"

namespace batchtune {

/// Upper bound of the search unless `--max-batch` says otherwise: micro-batches
/// past 8192 samples raise no device's throughput that we know of, and on a
/// CPU a single trial there takes seconds to minutes.
constexpr int64_t kDefaultMaxBatch = 8192;
/// Wall-clock budget of a search: it stops with the best size found so far.
constexpr double kDefaultTimeBudgetSeconds = 120;
/// The answer is within this share of the true limit when `predict` stops.
constexpr double kDefaultSearchTolerance = 0.02;

/// How the largest batch that fits is searched for.
///
/// - `predict` (default): fits peak(b) = fixed + per_sample * b from small
///   trials, tries the predicted limit, and closes the bracket around it.
/// - `power`: doubles from 2 until a trial fails (PyTorch Lightning's way).
/// - `binsearch`: `power`, then bisection down to a single sample.
/// - `backoff`: from 128, ×0.9 after each failure (Hugging Face accelerate's
///   `find_executable_batch_size`); a baseline for the benchmark.
enum class SearchStrategy { kPredict, kPower, kBinsearch, kBackoff };

/// `predict`, `power`, `binsearch` or `backoff`; throws `batchtune::Error`.
SearchStrategy parse_search_strategy(const std::string& name);
std::string to_string(SearchStrategy strategy);

struct SearchOptions {
  TORCH_ARG(SearchStrategy, strategy) = SearchStrategy::kPredict;
  /// Never tries a batch above this.
  TORCH_ARG(int64_t, max_batch) = kDefaultMaxBatch;
  /// Stops before a trial that would start past this many seconds.
  TORCH_ARG(double, time_budget_s) = kDefaultTimeBudgetSeconds;
  /// `predict` stops once the true limit is at most this share above the
  /// answer; 0 searches to the single sample like `binsearch`.
  TORCH_ARG(double, tolerance) = kDefaultSearchTolerance;
  /// Runs the answer once more at the end (`predict`, `binsearch`): a size
  /// that fitted only before other trials' leftovers (caches, workspaces,
  /// lazily loaded kernels) reopens the search below it.
  TORCH_ARG(bool, confirm) = true;
  /// Who reads the stop reason ("reached --max-batch 4096"): options named
  /// as this front end names them (`resolve` sets it from the tune's).
  TORCH_ARG(FrontEnd, front_end) = FrontEnd::kCli;
};

/// What a search found. `max_batch_size` is always a size that was tried
/// and fitted (0 when not even batch size 1 fits).
struct SearchResult {
  SearchStrategy strategy = SearchStrategy::kPredict;
  int64_t max_batch_size = 0;
  /// Smallest size that did not fit, when one was tried.
  std::optional<int64_t> smallest_failure;
  std::vector<TrialResult> trials;
  int64_t steps = 0;  ///< training steps run by all trials
  double seconds = 0;
  bool hit_time_budget = false;
  bool hit_max_batch = false;
  /// The answer fitted again in a trial at the end of the search.
  bool confirmed = false;
  /// The time budget stopped the search before it closed on the limit (no
  /// failure just above the answer, no `max_batch` reached): a larger batch
  /// may fit, and `max_batch_size` is a lower bound, not the limit.
  bool lower_bound = false;
  /// Why the search stopped, in plain words.
  std::string stop_reason;
};

/// Runs one trial at a batch size (the trial runner, or a fake in tests).
using TrialFunction = std::function<TrialResult(int64_t batch_size)>;
/// Called after each trial, e.g. for a progress line.
using TrialCallback = std::function<void(const TrialResult&, size_t index)>;

/// Searches for the largest batch size whose trial fits.
///
/// Example:
/// ```
///   TrialRunner runner(workload, *memory);
///   SearchResult r = search_max_batch(
///       [&](int64_t b) { return runner.run(TrialOptions().batch_size(b)); },
///       SearchOptions().max_batch(4096));
/// ```
SearchResult search_max_batch(const TrialFunction& trial, const SearchOptions& options,
                              const Clock& clock = steady_clock(),
                              const TrialCallback& on_trial = {});

/// The next batch size `strategy` would try after `trials`, or nothing when
/// it is done. Pure: the search is this function in a loop.
std::optional<int64_t> next_batch_size(const std::vector<TrialResult>& trials,
                                       const SearchOptions& options);

}  // namespace batchtune
