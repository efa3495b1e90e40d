#include "batchtune/common/estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace batchtune {
namespace {

double quantile(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}

/// P(X = i) for X ~ Binomial(n, 1/2), in log space (n can be in the
/// thousands: 0.5^n underflows long before).
double binomial_half_pmf(int64_t n, int64_t i) {
  const double log_choose = std::lgamma(static_cast<double>(n) + 1) -
                            std::lgamma(static_cast<double>(i) + 1) -
                            std::lgamma(static_cast<double>(n - i) + 1);
  return std::exp(log_choose + static_cast<double>(n) * std::log(0.5));
}

}  // namespace

double Estimate::relative_half_width() const {
  if (!(median > 0)) return 0;
  return std::max(high - median, median - low) / median;
}

Estimate Estimate::reciprocal(double scale) const {
  Estimate r = *this;
  r.median = median > 0 ? scale / median : 0;
  r.low = high > 0 ? scale / high : 0;
  r.high = low > 0 ? scale / low : 0;
  return r;
}

Estimate Estimate::scaled(double scale) const {
  Estimate r = *this;
  r.median *= scale;
  r.low *= scale;
  r.high *= scale;
  if (scale < 0) std::swap(r.low, r.high);
  return r;
}

Estimate estimate_median(std::vector<double> values, double level) {
  Estimate e;
  if (values.empty()) return e;
  std::sort(values.begin(), values.end());
  const auto n = static_cast<int64_t>(values.size());
  e.n = n;
  e.median = quantile(values, 0.5);
  // The largest k whose interval [x(k), x(n+1-k)] still covers the median
  // with probability >= level: coverage = 1 - 2 P(X <= k-1).
  int64_t k = 1;
  double below_k = binomial_half_pmf(n, 0);  // P(X <= k - 1)
  while (k + 1 <= (n + 1) / 2) {
    const double below_next = below_k + binomial_half_pmf(n, k);
    if (1 - 2 * below_next < level) break;
    below_k = below_next;
    ++k;
  }
  e.low = values[static_cast<size_t>(k - 1)];
  e.high = values[static_cast<size_t>(n - k)];
  e.level = n >= 2 ? std::max(0.0, 1 - 2 * below_k) : 0;
  return e;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return quantile(values, 0.5);
}

double relative_spread(std::vector<double> values) {
  if (values.size() < 2) return 0;
  std::sort(values.begin(), values.end());
  const double mid = quantile(values, 0.5);
  return mid > 0 ? (quantile(values, 0.75) - quantile(values, 0.25)) / mid : 0;
}

std::string format_level(double level) {
  const double percent = 100 * level;
  if (std::abs(percent - std::round(percent)) < 0.05) return fmt::format("{:.0f} %", percent);
  return fmt::format("{:.1f} %", percent);
}

}  // namespace batchtune
