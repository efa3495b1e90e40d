#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace batchtune {

/// The confidence every interval aims for, and every decision (precision,
/// chosen batch) must reach to be stated as one: 95 %.
constexpr double kConfidenceLevel = 0.95;
/// A reading whose interval reaches further than this share of its median
/// on either side is marked noisy: a decision never rests on it alone.
constexpr double kNoisyHalfWidth = 0.10;

/// A median with its confidence interval, from repeated readings.
///
/// The interval is distribution-free: the order statistics x(k) and
/// x(n+1-k) that cover the true median with probability at least `level`,
/// by the binomial distribution of how many readings fall below it (the
/// sign-test interval; no normality assumed, nothing random, so the same
/// readings give the same interval on every run). Step times are skewed by
/// other processes' bursts, which this interval tolerates and a mean ± 2σ
/// does not. With fewer than 6 readings not even [min, max] reaches 95 %:
/// `level` then says what was reached (5 readings: 93.75 %).
struct Estimate {
  double median = 0;
  double low = 0;
  double high = 0;
  /// The confidence the interval reaches (0 when there are no readings).
  double level = 0;
  int64_t n = 0;

  /// The larger distance from the median to an end, over the median
  /// (0.08: "±8 %").
  double relative_half_width() const;
  /// Reaches past `kNoisyHalfWidth`, or rests on fewer than two readings.
  bool noisy() const { return n < 2 || relative_half_width() > kNoisyHalfWidth; }
  /// The same estimate of `scale / x` (a step time turned into a rate).
  Estimate reciprocal(double scale = 1) const;
  /// The same estimate of `scale * x`.
  Estimate scaled(double scale) const;
};

/// The median of `values` with its distribution-free interval at `level`
/// (see `Estimate`); an empty estimate for no values.
Estimate estimate_median(std::vector<double> values, double level = kConfidenceLevel);

/// Median of `values` (0 for none).
double median(std::vector<double> values);
/// Interquartile range of `values` over their median (0 for fewer than 2).
double relative_spread(std::vector<double> values);

/// The confidence, in words, for reasons: "95 %", "93.8 %".
std::string format_level(double level);

}  // namespace batchtune
