#include "batchtune/tuning/search.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"

namespace batchtune {
namespace {

// Lightning's power scaling starts at 2 and doubles.
constexpr int64_t kPowerStart = 2;
constexpr int64_t kPowerFactor = 2;
// accelerate's find_executable_batch_size: 128, then x0.9 per failure.
constexpr int64_t kBackoffStart = 128;
constexpr double kBackoffFactor = 0.9;
// predict: the two small trials the first line is fitted through. Far apart
// for a well-conditioned slope, small enough to fit almost anywhere.
constexpr int64_t kPredictFirst = 2;
constexpr int64_t kPredictSecond = 16;
// predict never jumps further than this factor past the largest fit: at tiny
// batches the peak is often the optimizer step's, not the activations', so
// the first slope can be far too low; a scout trial on the way measures it.
constexpr int64_t kPredictMaxGrowth = 8;
// The answer is confirmed at most this many times: each failed confirmation
// reopens the search below it.
constexpr int64_t kMaxConfirmations = 2;
// After a failure, predict aims just under it when the failure is this close
// above the largest fit (the line was nearly right); further away it bisects.
constexpr double kPredictCloseRatio = 1.25;

/// What the trials so far say about the limit.
struct Bracket {
  int64_t best_fit = 0;               // largest size that fitted
  std::optional<int64_t> first_fail;  // smallest size that did not
};

Bracket bracket_of(const std::vector<TrialResult>& trials) {
  Bracket b;
  for (const auto& t : trials) {
    if (!t.fits && (!b.first_fail || t.batch_size < *b.first_fail)) b.first_fail = t.batch_size;
  }
  // A size that fitted once and failed when confirmed does not count: the
  // largest fit is below every failure.
  for (const auto& t : trials) {
    if (t.fits && (!b.first_fail || t.batch_size < *b.first_fail)) {
      b.best_fit = std::max(b.best_fit, t.batch_size);
    }
  }
  return b;
}

bool tried(const std::vector<TrialResult>& trials, int64_t batch) {
  return std::any_of(trials.begin(), trials.end(),
                     [&](const TrialResult& t) { return t.batch_size == batch; });
}

/// Bisection between the largest fit and the smallest failure, to the sample.
std::optional<int64_t> bisect(const Bracket& b) {
  if (!b.first_fail || *b.first_fail - b.best_fit <= 1) return std::nullopt;
  return b.best_fit + (*b.first_fail - b.best_fit) / 2;
}

std::optional<int64_t> next_power(const std::vector<TrialResult>& trials,
                                  const SearchOptions& options) {
  if (trials.empty()) return std::min(kPowerStart, options.max_batch());
  const TrialResult& last = trials.back();
  if (!last.fits) return std::nullopt;
  if (last.batch_size >= options.max_batch()) return std::nullopt;
  return std::min(last.batch_size * kPowerFactor, options.max_batch());
}

std::optional<int64_t> next_binsearch(const std::vector<TrialResult>& trials,
                                      const SearchOptions& options) {
  const Bracket b = bracket_of(trials);
  if (!b.first_fail) return next_power(trials, options);
  if (b.best_fit == 0) {  // even the start failed: bisect towards 1
    return *b.first_fail > 1 ? std::optional<int64_t>(*b.first_fail / 2) : std::nullopt;
  }
  return bisect(b);
}

std::optional<int64_t> next_backoff(const std::vector<TrialResult>& trials,
                                    const SearchOptions& options) {
  if (trials.empty()) return std::min(kBackoffStart, options.max_batch());
  const TrialResult& last = trials.back();
  if (last.fits || last.batch_size <= 1) return std::nullopt;
  return std::max<int64_t>(1, static_cast<int64_t>(std::floor(last.batch_size * kBackoffFactor)));
}

/// Done when the true limit (somewhere in [best_fit, first_fail - 1]) is at
/// most `tolerance` above best_fit.
bool closed(const Bracket& b, const SearchOptions& options) {
  if (b.best_fit >= options.max_batch()) return true;
  if (!b.first_fail) return false;
  if (b.best_fit == 0) return *b.first_fail <= 1;
  return static_cast<double>(*b.first_fail - 1) <=
         static_cast<double>(b.best_fit) * (1 + options.tolerance());
}

/// Largest b predicted to stay within the usable budget by the line through
/// the two largest fits, or nothing when the line does not rise.
std::optional<int64_t> predicted_limit(const std::vector<TrialResult>& trials) {
  std::vector<const TrialResult*> fits;
  for (const auto& t : trials) {
    if (t.fits) fits.push_back(&t);
  }
  if (fits.size() < 2) return std::nullopt;
  std::sort(fits.begin(), fits.end(), [](const TrialResult* a, const TrialResult* b) {
    return a->batch_size < b->batch_size;
  });
  const TrialResult& lo = *fits[fits.size() - 2];
  const TrialResult& hi = *fits.back();
  const double per_sample = static_cast<double>(hi.peak_bytes - lo.peak_bytes) /
                            static_cast<double>(hi.batch_size - lo.batch_size);
  if (!(per_sample > 0)) return std::nullopt;
  const double room = static_cast<double>(hi.usable_bytes - hi.peak_bytes);
  return hi.batch_size + static_cast<int64_t>(std::floor(room / per_sample));
}

/// The line through the two largest fits puts the limit at most `tolerance`
/// above the largest fit: a larger trial would only confirm it.
bool closed_by_line(const Bracket& b, int64_t predicted, const SearchOptions& options) {
  return predicted >= b.best_fit &&
         static_cast<double>(predicted) <=
             static_cast<double>(b.best_fit) * (1 + options.tolerance());
}

std::optional<int64_t> next_predict(const std::vector<TrialResult>& trials,
                                    const SearchOptions& options) {
  const int64_t cap = options.max_batch();
  if (trials.empty()) return std::min(kPredictFirst, cap);
  const Bracket b = bracket_of(trials);
  if (closed(b, options)) return std::nullopt;
  if (b.best_fit == 0) {  // nothing fits yet: halve towards 1
    return std::max<int64_t>(1, *b.first_fail / 2);
  }
  const int64_t upper = std::min(cap, b.first_fail.value_or(INT64_MAX) - 1);
  const int64_t lower = b.best_fit + 1;
  if (!predicted_limit(trials)) {
    // One fit and a failure above it: bisect, never a step of one at a time
    // down from the failure.
    if (b.first_fail) return bisect(b);
    // One fit so far (or a flat curve): a second point further out.
    const int64_t second = b.best_fit < kPredictSecond ? kPredictSecond
                                                       : b.best_fit * kPredictMaxGrowth;
    return std::clamp(second, lower, upper);
  }
  const int64_t predicted = *predicted_limit(trials);
  if (closed_by_line(b, predicted, options)) return std::nullopt;
  const bool last_failed = !trials.back().fits;
  const bool two_failed = trials.size() >= 2 && last_failed && !trials[trials.size() - 2].fits;
  int64_t next = 0;
  if (two_failed) {
    // The line keeps overshooting (a cliff, a workspace): bisect.
    next = *bisect(b);
  } else if (b.first_fail && predicted >= *b.first_fail - 1) {
    // The line says the limit is at or past a known failure. Close to it,
    // aim just under the failure so that a fit there closes the bracket.
    const double limit = static_cast<double>(*b.first_fail - 1);
    next = limit <= static_cast<double>(b.best_fit) * kPredictCloseRatio
               ? static_cast<int64_t>(std::ceil(limit / (1 + options.tolerance())))
               : *bisect(b);
  } else if (predicted <= b.best_fit) {
    // The line says we are at the limit: confirm with the first size that
    // would fall outside the tolerance.
    next = static_cast<int64_t>(
               std::floor(static_cast<double>(b.best_fit) * (1 + options.tolerance()))) + 1;
  } else {
    next = std::min(predicted, b.best_fit * kPredictMaxGrowth);
  }
  next = std::clamp(next, lower, upper);
  if (tried(trials, next)) return bisect(b);
  return next;
}

}  // namespace

SearchStrategy parse_search_strategy(const std::string& name) {
  if (name == "predict") return SearchStrategy::kPredict;
  if (name == "power") return SearchStrategy::kPower;
  if (name == "binsearch") return SearchStrategy::kBinsearch;
  if (name == "backoff") return SearchStrategy::kBackoff;
  throw OptionError(Option::kStrategy,
                    fmt::format("unknown search strategy '{}'; use predict, power, binsearch or "
                                "backoff",
                                name));
}

std::string to_string(SearchStrategy strategy) {
  switch (strategy) {
    case SearchStrategy::kPredict:
      return "predict";
    case SearchStrategy::kPower:
      return "power";
    case SearchStrategy::kBinsearch:
      return "binsearch";
    case SearchStrategy::kBackoff:
      return "backoff";
  }
  return "unknown";
}

std::optional<int64_t> next_batch_size(const std::vector<TrialResult>& trials,
                                       const SearchOptions& options) {
  switch (options.strategy()) {
    case SearchStrategy::kPredict:
      return next_predict(trials, options);
    case SearchStrategy::kPower:
      return next_power(trials, options);
    case SearchStrategy::kBinsearch:
      return next_binsearch(trials, options);
    case SearchStrategy::kBackoff:
      return next_backoff(trials, options);
  }
  return std::nullopt;
}

SearchResult search_max_batch(const TrialFunction& trial, const SearchOptions& options,
                              const Clock& clock, const TrialCallback& on_trial) {
  if (options.max_batch() < 1) {
    throw OptionError(Option::kMaxBatch,
                      fmt::format("must be at least 1, got {}", options.max_batch()));
  }
  if (!(options.time_budget_s() > 0)) {
    throw OptionError(Option::kTimeBudget,
                      fmt::format("must be positive, got {}", options.time_budget_s()));
  }
  if (!(options.tolerance() >= 0 && options.tolerance() < 1)) {
    throw OptionError(Option::kSearchTolerance,
                      fmt::format("must be at least 0 and below 1, got {}", options.tolerance()));
  }
  const auto now = [&] { return clock.now_s(); };
  const double start = now();
  SearchResult result;
  result.strategy = options.strategy();
  const auto run = [&](int64_t batch) {
    result.trials.push_back(trial(batch));
    result.steps += result.trials.back().steps_run;
    if (on_trial) on_trial(result.trials.back(), result.trials.size() - 1);
  };
  int64_t confirmations = 0;
  while (true) {
    while (auto next = next_batch_size(result.trials, options)) {
      if (now() - start >= options.time_budget_s()) {
        result.hit_time_budget = true;
        break;
      }
      run(*next);
    }
    // The answer once more, after everything the trials since left behind
    // (caches, workspaces, lazily loaded kernels): what a later probe or
    // training at that size meets. A failure reopens the search below it.
    const int64_t answer = bracket_of(result.trials).best_fit;
    // power and backoff imitate Lightning's and accelerate's finders, which
    // do not confirm: their trial counts stay comparable.
    const bool imitation = options.strategy() == SearchStrategy::kPower ||
                           options.strategy() == SearchStrategy::kBackoff;
    if (!options.confirm() || imitation || answer < 1 || result.hit_time_budget ||
        confirmations >= kMaxConfirmations) {
      break;
    }
    ++confirmations;
    run(answer);
    if (result.trials.back().fits) {
      result.confirmed = true;
      break;
    }
  }
  result.seconds = now() - start;
  const Bracket b = bracket_of(result.trials);
  result.max_batch_size = b.best_fit;
  result.smallest_failure = b.first_fail;
  result.hit_max_batch = b.best_fit >= options.max_batch();
  result.lower_bound = result.hit_time_budget && b.best_fit > 0 && !result.hit_max_batch &&
                       !(b.first_fail && closed(b, options));
  if (result.hit_time_budget) {
    result.stop_reason = fmt::format(
        "stopped by the time budget ({:.0f} s) with the best size found so far{}",
        options.time_budget_s(),
        result.lower_bound
            ? fmt::format(": {} is a lower bound, a larger batch may fit", b.best_fit)
            : std::string());
  } else if (b.best_fit == 0) {
    result.stop_reason = "not even batch size 1 fits";
  } else if (result.hit_max_batch) {
    result.stop_reason = fmt::format("reached {} {}", option_name(Option::kMaxBatch, options.front_end()),
                                     options.max_batch());
  } else if (b.first_fail && closed(b, options)) {
    result.stop_reason = fmt::format("{} fits and {} does not", b.best_fit, *b.first_fail);
  } else if (options.strategy() == SearchStrategy::kPredict) {
    result.stop_reason = fmt::format(
        "{} fits, and the peak measured against batch size puts the limit within {:.0f} % above it",
        b.best_fit, options.tolerance() * 100);
  } else if (b.first_fail) {
    result.stop_reason = fmt::format("{} fits and {} does not", b.best_fit, *b.first_fail);
  } else {
    result.stop_reason = fmt::format("{} fits", b.best_fit);
  }
  if (result.confirmed) result.stop_reason += "; confirmed by a second trial at the end";
  return result;
}

}  // namespace batchtune
