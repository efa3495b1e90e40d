#include "batchtune/tuning/token_budget.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "batchtune/common/error.h"
#include "batchtune/common/size.h"

namespace batchtune {
namespace {

/// Solves the n x n system `a x = b` (n ≤ 3) by Gaussian elimination with
/// partial pivoting; false when it is singular.
template <size_t N>
bool solve(std::array<std::array<double, N>, N> a, std::array<double, N> b,
           std::array<double, N>& x) {
  for (size_t col = 0; col < N; ++col) {
    size_t pivot = col;
    for (size_t row = col + 1; row < N; ++row) {
      if (std::abs(a[row][col]) > std::abs(a[pivot][col])) pivot = row;
    }
    if (std::abs(a[pivot][col]) < 1e-300) return false;
    std::swap(a[col], a[pivot]);
    std::swap(b[col], b[pivot]);
    for (size_t row = col + 1; row < N; ++row) {
      const double f = a[row][col] / a[col][col];
      for (size_t k = col; k < N; ++k) a[row][k] -= f * a[col][k];
      b[row] -= f * b[col];
    }
  }
  for (size_t i = N; i-- > 0;) {
    double sum = b[i];
    for (size_t k = i + 1; k < N; ++k) sum -= a[i][k] * x[k];
    x[i] = sum / a[i][i];
  }
  return true;
}

/// Weighted least squares of peak over the features [1, b·L, b·L²][0..N):
/// weights 1/peak², so that every point counts by its relative error.
/// Features are scaled to order 1 before solving.
template <size_t N>
bool least_squares(const std::vector<MemoryPoint>& points, std::array<double, N>& coef) {
  std::array<double, 3> scale{1, 1, 1};
  for (const auto& p : points) {
    const double tokens = static_cast<double>(p.batch_size) * static_cast<double>(p.length);
    scale[1] = std::max(scale[1], tokens);
    scale[2] = std::max(scale[2], tokens * static_cast<double>(p.length));
  }
  std::array<std::array<double, N>, N> a{};
  std::array<double, N> b{};
  for (const auto& p : points) {
    const double tokens = static_cast<double>(p.batch_size) * static_cast<double>(p.length);
    const std::array<double, 3> f{1.0, tokens / scale[1],
                                  tokens * static_cast<double>(p.length) / scale[2]};
    const double y = static_cast<double>(p.peak_bytes);
    const double w = 1.0 / (y * y);
    for (size_t i = 0; i < N; ++i) {
      for (size_t k = 0; k < N; ++k) a[i][k] += w * f[i] * f[k];
      b[i] += w * f[i] * y;
    }
  }
  if (!solve<N>(a, b, coef)) return false;
  for (size_t i = 0; i < N; ++i) coef[i] /= scale[i];
  return true;
}

double worst_error(const MemoryModel& model, const std::vector<MemoryPoint>& points) {
  double worst = 0;
  for (const auto& p : points) {
    const double measured = static_cast<double>(p.peak_bytes);
    worst = std::max(worst, std::abs(model.predict(p.batch_size, p.length) - measured) / measured);
  }
  return worst;
}

std::string bucket_text(const std::vector<LengthBucket>& buckets) {
  std::string text;
  for (const auto& b : buckets) {
    text += fmt::format("{}{} x {}", text.empty() ? "" : ", ", b.micro_batch_size, b.max_length);
  }
  return text;
}

}  // namespace

double MemoryModel::predict(int64_t batch, int64_t length) const {
  const double tokens = static_cast<double>(batch) * static_cast<double>(length);
  return fixed_bytes + per_token_bytes * tokens +
         per_token_length_bytes * tokens * static_cast<double>(length);
}

int64_t MemoryModel::max_batch(int64_t length, int64_t usable_bytes) const {
  const double per_sample = per_token_bytes * static_cast<double>(length) +
                            per_token_length_bytes * static_cast<double>(length) *
                                static_cast<double>(length);
  const double room = static_cast<double>(usable_bytes) - fixed_bytes;
  if (!(per_sample > 0) || room <= 0) return 0;
  return static_cast<int64_t>(std::min(std::floor(room / per_sample),
                                       static_cast<double>(kMaxPlanCount)));
}

int64_t MemoryModel::token_budget(int64_t max_length, int64_t usable_bytes) const {
  const double per_token =
      per_token_bytes + per_token_length_bytes * static_cast<double>(max_length);
  const double room = static_cast<double>(usable_bytes) - fixed_bytes;
  if (!(per_token > 0) || room <= 0) return 0;
  return static_cast<int64_t>(std::min(std::floor(room / per_token),
                                       static_cast<double>(kMaxPlanCount)));
}

MemoryModel fit_memory_model(const std::vector<MemoryPoint>& points) {
  std::vector<MemoryPoint> usable;
  for (const auto& p : points) {
    if (p.batch_size > 0 && p.length > 0 && p.peak_bytes > 0) usable.push_back(p);
  }
  const auto distinct_tokens = [&] {
    for (const auto& p : usable) {
      if (p.batch_size * p.length != usable.front().batch_size * usable.front().length) return true;
    }
    return false;
  };
  if (usable.size() < 2 || !distinct_tokens()) {
    throw Error(fmt::format("memory model: needs peaks at two or more token counts, got {} "
                            "point(s)",
                            usable.size()));
  }
  MemoryModel linear;
  std::array<double, 2> c2{};
  if (!least_squares<2>(usable, c2)) throw Error("memory model: the linear fit is singular");
  linear.fixed_bytes = c2[0];
  linear.per_token_bytes = c2[1];
  linear.fit_error = worst_error(linear, usable);
  linear.linear_fit_error = linear.fit_error;

  // The quadratic term needs three points and two lengths at least.
  const bool lengths_differ =
      std::any_of(usable.begin(), usable.end(),
                  [&](const MemoryPoint& p) { return p.length != usable.front().length; });
  std::array<double, 3> c3{};
  if (usable.size() >= 3 && lengths_differ && least_squares<3>(usable, c3)) {
    MemoryModel full;
    full.fixed_bytes = c3[0];
    full.per_token_bytes = c3[1];
    full.per_token_length_bytes = c3[2];
    full.quadratic = true;
    full.fit_error = worst_error(full, usable);
    full.linear_fit_error = linear.fit_error;
    full.fitted_quadratic_bytes = c3[2];
    linear.fitted_quadratic_bytes = c3[2];
    const bool needed = linear.fit_error > kLinearFitTolerance &&
                        full.fit_error <= kQuadraticGain * linear.fit_error;
    if (needed && c3[2] > 0 && c3[1] >= 0) return full;
  }
  return linear;
}

std::vector<int64_t> length_bucket_bounds(LengthRange range) {
  std::vector<int64_t> bounds{range.min};
  int64_t next = 1;
  while (next <= range.min) next *= 2;
  for (; next < range.max; next *= 2) bounds.push_back(next);
  if (bounds.back() != range.max) bounds.push_back(range.max);
  return bounds;
}

std::vector<LengthBucket> buckets_for_budget(const MemoryModel& model, int64_t token_budget,
                                             const std::vector<int64_t>& bounds,
                                             int64_t usable_bytes, int64_t max_batch,
                                             int64_t max_batch_at_longest) {
  std::vector<LengthBucket> buckets;
  for (size_t i = 0; i < bounds.size(); ++i) {
    const int64_t bound = bounds[i];
    int64_t micro = std::min(token_budget / bound, max_batch);
    const int64_t modelled = model.max_batch(bound, usable_bytes);
    if (modelled > 0) micro = std::min(micro, modelled);
    if (i + 1 == bounds.size() && max_batch_at_longest > 0) {
      micro = std::min(micro, max_batch_at_longest);
    }
    buckets.push_back({bound, std::max<int64_t>(1, micro)});
  }
  return buckets;
}

TokenBudgetResult plan_token_budget(const LengthTrial& trial,
                                    const std::vector<TrialResult>& search_trials,
                                    int64_t max_batch_at_longest, LengthRange range,
                                    int64_t usable_bytes, int64_t max_batch) {
  TORCH_CHECK(range.min >= 1 && range.min < range.max, "plan_token_budget: a range of lengths");
  TORCH_CHECK(max_batch_at_longest >= 1, "plan_token_budget: nothing fits at the longest length");
  TokenBudgetResult result;
  result.range = range;
  std::vector<MemoryPoint> points;
  // At the longest length: the search's fitting trials, the two largest.
  std::vector<TrialResult> fits;
  for (const auto& t : search_trials) {
    if (t.fits && t.peak_bytes > 0) fits.push_back(t);
  }
  std::sort(fits.begin(), fits.end(),
            [](const TrialResult& a, const TrialResult& b) { return a.batch_size > b.batch_size; });
  for (size_t i = 0; i < fits.size() && i < 2; ++i) {
    points.push_back({fits[i].batch_size, range.max, fits[i].peak_bytes});
  }
  const auto run = [&](int64_t batch, int64_t length) {
    TrialResult t = trial(batch, length);
    t.sequence_length = length;
    result.trials.push_back(t);
    return t;
  };
  // Shorter lengths at a half and three quarters of the tokens that fit at
  // the longest: near the limit, where activations, not the optimizer
  // step, make the peak.
  const double longest_tokens =
      static_cast<double>(max_batch_at_longest) * static_cast<double>(range.max);
  std::vector<int64_t> lengths{range.min};
  const auto middle = static_cast<int64_t>(std::llround(
      std::sqrt(static_cast<double>(range.min) * static_cast<double>(range.max))));
  if (middle > range.min && middle < range.max) lengths.push_back(middle);
  for (int64_t length : lengths) {
    for (double share : {0.5, 0.75}) {
      const int64_t batch = std::clamp<int64_t>(
          static_cast<int64_t>(share * longest_tokens / static_cast<double>(length)), 1, max_batch);
      if (std::any_of(points.begin(), points.end(), [&](const MemoryPoint& p) {
            return p.batch_size == batch && p.length == length;
          })) {
        continue;
      }
      const TrialResult t = run(batch, length);
      if (t.fits) points.push_back({batch, length, t.peak_bytes});
    }
  }
  result.model = fit_memory_model(points);

  // The budget, verified at the extremes: the shortest bucket (the most
  // samples) and the longest (the largest per-sample activations).
  const std::vector<int64_t> bounds = length_bucket_bounds(range);
  // At least one sample of the longest length (else nothing could train).
  int64_t budget = std::max(result.model.token_budget(range.max, usable_bytes), range.max);
  std::string shrunk;
  for (int64_t round = 0; round < kMaxTokenBudgetRounds; ++round) {
    result.buckets = buckets_for_budget(result.model, budget, bounds, usable_bytes, max_batch,
                                        max_batch_at_longest);
    result.checks.clear();
    bool all_fit = true;
    int64_t next_budget = budget;
    for (const LengthBucket* bucket : {&result.buckets.front(), &result.buckets.back()}) {
      MemoryCheck check{bucket->micro_batch_size, bucket->max_length,
                        result.model.predict(bucket->micro_batch_size, bucket->max_length), 0,
                        false};
      // At the longest, the search's own trial at that batch is a check already.
      const auto searched = std::find_if(fits.begin(), fits.end(), [&](const TrialResult& t) {
        return t.batch_size == check.batch_size;
      });
      // A check fits within `usable_bytes`, which may be less than the
      // trials' own usable memory (room kept for accumulated gradients).
      if (bucket == &result.buckets.back() && searched != fits.end() &&
          searched->peak_bytes <= usable_bytes) {
        check.measured_bytes = searched->peak_bytes;
        check.fits = true;
      } else {
        const TrialResult t = run(check.batch_size, check.length);
        check.measured_bytes = t.peak_bytes;
        check.fits = t.fits && t.peak_bytes <= usable_bytes;
      }
      result.checks.push_back(check);
      if (check.fits) continue;
      all_fit = false;
      // Aim under what the measured peak says would fit; without a peak
      // (an out-of-memory), step down by a quarter.
      const double fixed = result.model.fixed_bytes;
      const double measured = static_cast<double>(check.measured_bytes);
      const double factor =
          check.measured_bytes > 0 && measured > fixed
              ? kTokenBudgetBackoff * (static_cast<double>(usable_bytes) - fixed) / (measured - fixed)
              : 0.75;
      const auto tokens = static_cast<double>(check.batch_size * check.length);
      next_budget = std::min(next_budget, static_cast<int64_t>(std::clamp(factor, 0.1, 0.99) *
                                                               tokens));
    }
    if (all_fit) break;
    shrunk = fmt::format("; a check did not fit, so the budget was shrunk from {} to {} tokens",
                         budget, next_budget);
    budget = std::max<int64_t>(next_budget, range.max);
  }
  result.token_budget = budget;
  result.buckets = buckets_for_budget(result.model, budget, bounds, usable_bytes, max_batch,
                                      max_batch_at_longest);
  const MemoryModel& m = result.model;
  result.reason = fmt::format(
      "token budget {}: peak ≈ {} + {:.0f} B x batch x length{} (fitted to {} peaks within {:.1f} "
      "%; {}) leaves {} tokens per micro-batch at every length up to {} in {} usable; checked "
      "at lengths {} and {} by real trials{}",
      budget, format_bytes(static_cast<int64_t>(m.fixed_bytes)), m.per_token_bytes,
      m.quadratic ? fmt::format(" + {:.3g} B x batch x length²", m.per_token_length_bytes) : "",
      points.size(), 100 * m.fit_error,
      m.quadratic ? fmt::format("linear was off by {:.1f} %", 100 * m.linear_fit_error)
                  : "linear in tokens: no quadratic term needed",
      budget, range.max, format_bytes(usable_bytes), result.buckets.front().max_length,
      result.buckets.back().max_length, shrunk);
  if (!std::all_of(result.checks.begin(), result.checks.end(),
                   [](const MemoryCheck& c) { return c.fits; })) {
    result.reason += fmt::format(" (a check still failed after {} rounds, so the last budget "
                                 "is unchecked)",
                                 kMaxTokenBudgetRounds);
  }
  result.reason += "; buckets (samples x tokens): " + bucket_text(result.buckets);
  return result;
}

}  // namespace batchtune
