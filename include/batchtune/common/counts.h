#pragma once

#include <cstdint>
#include <optional>

namespace batchtune {

/// Batch sizes, accumulation steps, world sizes, global batches, warm-up
/// steps and token budgets above this are typos: 2^40 samples per step is
/// far past any device. Products of them are computed with overflow checks
/// (`checked_product`).
constexpr int64_t kMaxPlanCount = int64_t{1} << 40;

/// `a × b`, or nullopt when it would pass `kMaxPlanCount` (or overflow).
std::optional<int64_t> checked_product(int64_t a, int64_t b);

/// ⌈a / b⌉ for a ≥ 0 and b ≥ 1: the micro-batches of at most `b` that hold `a` samples.
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace batchtune
