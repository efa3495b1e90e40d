#include "batchtune/tuning/goodput.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace batchtune {
namespace {

/// `a` is measured faster than `b` beyond doubt: neither row noisy, and,
/// where both have intervals, `a`'s above `b`'s. Rows without intervals
/// (n = 0: figures given, not timed) compare by their medians.
bool clearly_faster(const SweepRow& a, const SweepRow& b) {
  if (!(a.samples_per_s > b.samples_per_s)) return false;
  if (a.noisy || b.noisy) return false;
  if (a.samples_per_s_ci.n == 0 || b.samples_per_s_ci.n == 0) return true;
  return a.samples_per_s_ci.low > b.samples_per_s_ci.high;
}

}  // namespace

std::vector<GoodputCandidate> goodput_candidates(const std::vector<SweepRow>& rows,
                                                 double noise_scale, int64_t base_batch,
                                                 int64_t max_global_batch) {
  TORCH_CHECK(!rows.empty(), "goodput_candidates: no sweep rows");
  TORCH_CHECK(base_batch >= 1, "goodput_candidates: base batch must be at least 1, got ",
              base_batch);
  int64_t largest = 0;
  for (const auto& row : rows) largest = std::max(largest, row.batch_size);
  int64_t cap = std::max(base_batch, largest * kGoodputMaxAccumulation);
  if (max_global_batch > 0) cap = std::min(cap, std::max(base_batch, max_global_batch));

  std::set<int64_t> globals{base_batch};
  for (const auto& row : rows) globals.insert(row.batch_size);
  for (int64_t b = 1; b <= cap; b *= 2) globals.insert(b);

  std::vector<GoodputCandidate> out;
  for (int64_t global : globals) {
    if (global < base_batch || global > cap) continue;
    // The largest dividing row, unless a smaller one is clearly faster.
    const SweepRow* largest = nullptr;
    for (const auto& row : rows) {
      if (row.batch_size <= global && global % row.batch_size == 0 &&
          (largest == nullptr || row.batch_size > largest->batch_size)) {
        largest = &row;
      }
    }
    // No measured micro-batch divides it, or only with too many micro-batches.
    if (largest == nullptr || global / largest->batch_size > kGoodputMaxAccumulation) continue;
    const SweepRow* best = largest;
    const SweepRow* untold = nullptr;  // faster by its median, not beyond doubt
    for (const auto& row : rows) {
      if (row.batch_size > global || global % row.batch_size != 0 ||
          global / row.batch_size > kGoodputMaxAccumulation) {
        continue;
      }
      if (clearly_faster(row, *largest)) {
        if (row.samples_per_s > best->samples_per_s || best == largest) best = &row;
      } else if (row.samples_per_s > largest->samples_per_s &&
                 (untold == nullptr || row.samples_per_s > untold->samples_per_s)) {
        untold = &row;
      }
    }
    GoodputCandidate c;
    c.global_batch_size = global;
    c.micro_batch_size = best->batch_size;
    c.accumulation_steps = global / best->batch_size;
    c.samples_per_s = best->samples_per_s;
    c.efficiency = statistical_efficiency(noise_scale, static_cast<double>(base_batch),
                                          static_cast<double>(global));
    c.goodput = c.samples_per_s * c.efficiency;
    if (best == largest && untold != nullptr) {
      c.micro_note = fmt::format(
          "micro-batch {}, the largest that divides {}: the rows cannot tell batch {}'s {:.1f} "
          "samples/s from its {:.1f} ({}), and a larger micro-batch is not slower unless "
          "measured so",
          largest->batch_size, global, untold->batch_size, untold->samples_per_s,
          largest->samples_per_s,
          untold->noisy || largest->noisy ? "noisy rows" : "their intervals overlap");
    }
    out.push_back(c);
  }
  return out;
}

GoodputChoice select_goodput(const std::vector<GoodputCandidate>& candidates, double noise_scale,
                             int64_t base_batch) {
  TORCH_CHECK(!candidates.empty(), "select_goodput: no candidates");
  const GoodputCandidate* best = &candidates.front();
  const GoodputCandidate* fastest = &candidates.front();
  for (const auto& c : candidates) {
    if (c.goodput > best->goodput ||
        (c.goodput == best->goodput && c.global_batch_size < best->global_batch_size)) {
      best = &c;
    }
    if (c.samples_per_s > fastest->samples_per_s ||
        (c.samples_per_s == fastest->samples_per_s &&
         c.global_batch_size < fastest->global_batch_size)) {
      fastest = &c;
    }
  }
  const auto run_as = [](const GoodputCandidate& c) {
    return c.accumulation_steps == 1
               ? fmt::format("micro-batch {}, no accumulation", c.micro_batch_size)
               : fmt::format("micro-batch {} x {} accumulation", c.micro_batch_size,
                             c.accumulation_steps);
  };
  std::string reason = fmt::format(
      "goodput: global batch {} ({}) makes the most progress per second: {:.1f} samples/s x "
      "statistical efficiency {:.3f} = {:.1f} useful samples/s, with gradient noise scale {:.0f} "
      "and base batch {}",
      best->global_batch_size, run_as(*best), best->samples_per_s, best->efficiency,
      best->goodput, noise_scale, base_batch);
  if (fastest->global_batch_size != best->global_batch_size) {
    reason += fmt::format(
        "; the fastest, global batch {} at {:.1f} samples/s, has efficiency {:.3f} and so only "
        "{:.1f}",
        fastest->global_batch_size, fastest->samples_per_s, fastest->efficiency, fastest->goodput);
  }
  if (!best->micro_note.empty()) reason += "; " + best->micro_note;
  return {*best, reason};
}

}  // namespace batchtune
