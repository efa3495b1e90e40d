#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "batchtune/data/input_spec.h"
#include "batchtune/plan/plan.h"
#include "batchtune/step/trial.h"

namespace batchtune {

/// One measured peak: a trial at `batch_size` samples of `length` tokens.
struct MemoryPoint {
  int64_t batch_size = 0;
  int64_t length = 0;
  int64_t peak_bytes = 0;
};

/// Peak device memory of a sequence model's training step as a function of
/// the batch and the sequence length:
///
///   peak ≈ fixed + per_token × (batch × length) + per_token_length × (batch × length²)
///
/// `fixed` is the parameters, gradients and optimizer state; `per_token`
/// the activations, which grow with the tokens of the micro-batch; the
/// quadratic term is attention's score matrix where the attention kernel
/// materialises it (PyTorch's fused kernels do not: the term is then 0 and
/// the model linear in tokens).
struct MemoryModel {
  double fixed_bytes = 0;
  double per_token_bytes = 0;
  /// 0 unless the quadratic term was needed (`quadratic`).
  double per_token_length_bytes = 0;
  bool quadratic = false;
  /// Largest |predicted − measured| / measured over the points fitted.
  double fit_error = 0;
  /// The linear model's, fitted to the same points: how much (if at all)
  /// the quadratic term helped.
  double linear_fit_error = 0;
  /// The quadratic coefficient the full fit found, whether or not it was
  /// kept (for the report: how close to linear the memory is).
  double fitted_quadratic_bytes = 0;

  /// Predicted peak bytes of a micro-batch of `batch` samples of `length` tokens.
  double predict(int64_t batch, int64_t length) const;
  /// The largest batch at `length` whose predicted peak stays within
  /// `usable_bytes`; 0 when none does.
  int64_t max_batch(int64_t length, int64_t usable_bytes) const;
  /// The most (padded) tokens per micro-batch whose predicted peak stays
  /// within `usable_bytes` at every length up to `max_length`: the worst
  /// length is the longest, where the quadratic term is largest.
  int64_t token_budget(int64_t max_length, int64_t usable_bytes) const;
};

/// The linear fit must be this close (largest relative error) to every
/// point, or the quadratic term is tried.
constexpr double kLinearFitTolerance = 0.03;
/// ... and the quadratic term is kept only when it at least halves the
/// linear fit's largest error (a term that only fits noise is dropped).
constexpr double kQuadraticGain = 0.5;

/// Least squares over the points in relative error (weights 1/peak²): the
/// linear model, and the quadratic one where it is needed (see above).
/// Needs at least two points of different token counts; throws
/// `batchtune::Error` otherwise.
MemoryModel fit_memory_model(const std::vector<MemoryPoint>& points);

/// Bucket bounds for a length range: powers of two from the shortest length
/// up, and the longest length last (16..512: 16, 32, 64, 128, 256, 512;
/// 10..100: 10, 16, 32, 64, 100). Within a bucket a micro-batch is padded to
/// its longest sample, at most the bound.
std::vector<int64_t> length_bucket_bounds(LengthRange range);

/// A check of the model against a real trial.
struct MemoryCheck {
  int64_t batch_size = 0;
  int64_t length = 0;
  double predicted_bytes = 0;
  int64_t measured_bytes = 0;  ///< the trial's peak (0 after an out-of-memory)
  bool fits = false;
};

/// What the length phase of a tune found: the model, the trials it took,
/// its checks at the shortest and longest lengths, and the plan's budget and
/// buckets.
struct TokenBudgetResult {
  LengthRange range;
  MemoryModel model;
  /// Every trial run to measure and verify (each with its `sequence_length`).
  std::vector<TrialResult> trials;
  /// The verifying trials, predicted against measured.
  std::vector<MemoryCheck> checks;
  int64_t token_budget = 0;
  std::vector<LengthBucket> buckets;
  /// One sentence for the plan: how the budget was found.
  std::string reason;
};

/// Runs one trial of `batch` samples of `length` tokens.
using LengthTrial = std::function<TrialResult(int64_t batch, int64_t length)>;

/// Rounds of verification at most: each failed check shrinks the budget by
/// what the trial measured, and checks again.
constexpr int64_t kMaxTokenBudgetRounds = 3;
/// Shrinking after a failed check aims this far below what the measured
/// peak says would just fit.
constexpr double kTokenBudgetBackoff = 0.97;

/// Plans a token budget over `range` from the search at the longest length
/// (`search_trials`, `max_batch_at_longest` the largest batch that fitted
/// there): trials at the shortest and a middle length at a half and three
/// quarters of the longest's tokens, a fit of the memory model, the budget
/// and buckets it gives within `usable_bytes` (no micro-batch above
/// `max_batch`), verified by real trials at the shortest and longest
/// bucket; a failed check shrinks the budget and checks again.
///
/// Example:
/// ```
///   auto planned = batchtune::plan_token_budget(
///       [&](int64_t b, int64_t len) {
///         return runner.run(batchtune::TrialOptions().batch_size(b).sequence_length(len));
///       },
///       search.trials, search.max_batch_size, {16, 512}, memory.usable_bytes(), 8192);
/// ```
TokenBudgetResult plan_token_budget(const LengthTrial& trial,
                                    const std::vector<TrialResult>& search_trials,
                                    int64_t max_batch_at_longest, LengthRange range,
                                    int64_t usable_bytes, int64_t max_batch);

/// The buckets a budget gives: at each bound the fewest of the budget's
/// samples (budget / bound), the model's largest batch there and
/// `max_batch`; at the longest also `max_batch_at_longest`. A bucket gets
/// at least 1.
std::vector<LengthBucket> buckets_for_budget(const MemoryModel& model, int64_t token_budget,
                                             const std::vector<int64_t>& bounds,
                                             int64_t usable_bytes, int64_t max_batch,
                                             int64_t max_batch_at_longest);

}  // namespace batchtune
