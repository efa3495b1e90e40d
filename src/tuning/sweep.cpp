#include "batchtune/tuning/sweep.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "batchtune/common/error.h"
#include "batchtune/common/interleaved_rounds.h"
#include "batchtune/common/option.h"

namespace batchtune {
namespace {

// Below this many samples the model and its optimizer leave the batch no
// room: more memory (or less per sample) is the only way up.
constexpr int64_t kMemoryBoundBatch = 8;

}  // namespace

std::vector<int64_t> sweep_grid(int64_t max_batch) {
  std::vector<int64_t> grid;
  for (int64_t b = 1; b < max_batch; b *= 2) grid.push_back(b);
  if (max_batch >= 1) grid.push_back(max_batch);
  return grid;
}

std::vector<int64_t> sweep_order(int64_t max_batch, int64_t target_per_process) {
  std::vector<int64_t> grid = sweep_grid(max_batch);
  if (grid.empty()) return grid;
  std::vector<int64_t> order{grid.back()};
  grid.pop_back();
  for (int64_t d = std::min(max_batch - 1, target_per_process);
       d >= 1 && static_cast<int64_t>(order.size()) <= kTargetDivisors; --d) {
    if (target_per_process % d != 0) continue;
    order.push_back(d);
    grid.erase(std::remove(grid.begin(), grid.end(), d), grid.end());
  }
  order.insert(order.end(), grid.begin(), grid.end());
  return order;
}

SweepRow sweep_row(const TrialResult& trial) {
  SweepRow row;
  row.batch_size = trial.batch_size;
  row.amp = trial.amp;
  // The row's speed is its fastest step (Chen & Revels 2016): other
  // processes only ever slow a step down, so the minimum is the figure load
  // cannot inflate, where a median moves with a burst that covers half the
  // steps. The interval and spread stay the median's: how steady the row was.
  const auto fastest = std::min_element(trial.step_seconds.begin(), trial.step_seconds.end());
  row.samples_per_s = fastest != trial.step_seconds.end() && *fastest > 0
                          ? static_cast<double>(trial.batch_size) / *fastest
                          : trial.samples_per_s;
  row.tokens_per_s = row.samples_per_s * static_cast<double>(trial.sequence_length);
  row.step_ms = trial.step_ms;
  row.samples_per_s_ci = trial.samples_per_s_ci;
  row.step_ms_ci = trial.step_ms_ci;
  row.noisy = trial.noisy;
  row.noise_cause = trial.noise_cause;
  row.busy = trial.busy;
  row.peak_bytes = trial.peak_bytes;
  row.steps = trial.steps_run;
  row.utilization = trial.utilization;
  if (trial.energy_joules && !trial.step_seconds.empty()) {
    row.energy_j_per_sample =
        *trial.energy_joules /
        static_cast<double>(trial.batch_size * static_cast<int64_t>(trial.step_seconds.size()));
  }
  // Spread of samples/s is that of the step time (its inverse, to first order).
  row.samples_per_s_spread = trial.step_ms_spread;
  return row;
}

bool timed_well_enough(const TrialResult& trial) {
  return trial.fits && static_cast<int64_t>(trial.step_seconds.size()) >= kSweepTimedSteps &&
         !trial.noisy;
}

Objective parse_objective(const std::string& name) {
  if (name == "throughput") return Objective::kThroughput;
  if (name == "max-fit") return Objective::kMaxFit;
  if (name == "goodput") return Objective::kGoodput;
  if (name == "energy") return Objective::kEnergy;
  throw OptionError(Option::kObjective,
                    fmt::format("unknown objective '{}'; use throughput, max-fit, goodput or energy",
                                name));
}

std::string to_string(Objective objective) {
  switch (objective) {
    case Objective::kThroughput: return "throughput";
    case Objective::kMaxFit: return "max-fit";
    case Objective::kGoodput: return "goodput";
    case Objective::kEnergy: return "energy";
  }
  return "throughput";
}

Selection select_batch(const std::vector<SweepRow>& rows, Objective objective, double tolerance) {
  TORCH_CHECK(!rows.empty(), "select_batch: no sweep rows");
  TORCH_CHECK(objective == Objective::kThroughput || objective == Objective::kMaxFit,
              "select_batch: ", to_string(objective),
              " is chosen by select_goodput / select_energy");
  if (!(tolerance >= 0 && tolerance < 1)) {
    throw OptionError(Option::kTolerance,
                      fmt::format("must be at least 0 and below 1, got {}", tolerance));
  }
  const auto largest = std::max_element(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.batch_size < b.batch_size;
  });
  if (objective == Objective::kMaxFit) {
    return {largest->batch_size,
            fmt::format("max-fit: {} is the largest batch that fits ({:.1f} samples/s)",
                        largest->batch_size, largest->samples_per_s),
            1.0,
            {}};
  }
  const auto best = std::max_element(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.samples_per_s < b.samples_per_s;
  });
  const double floor = best->samples_per_s * (1 - tolerance);
  const SweepRow* chosen = &*best;
  for (const auto& row : rows) {
    if (row.samples_per_s >= floor && row.batch_size < chosen->batch_size) chosen = &row;
  }
  Selection s;
  s.batch_size = chosen->batch_size;
  // Which rows the intervals leave in doubt. The true best is at least the
  // largest lower end and at most the largest upper end; the choice holds
  // when the chosen row is within the tolerance of every other row's upper
  // end, and every smaller row's upper end lies below the tolerance band
  // under the largest lower end.
  const auto low_of = [](const SweepRow& r) {
    return r.samples_per_s_ci.n > 0 ? r.samples_per_s_ci.low : r.samples_per_s;
  };
  const auto high_of = [](const SweepRow& r) {
    return r.samples_per_s_ci.n > 0 ? r.samples_per_s_ci.high : r.samples_per_s;
  };
  double surely_reached = 0;
  for (const auto& row : rows) surely_reached = std::max(surely_reached, low_of(row));
  double level = 1;
  for (const auto& row : rows) {
    // A row without an interval (written by hand, not measured) counts as exact.
    level = std::min(level, row.samples_per_s_ci.n > 0 ? row.samples_per_s_ci.level : 1.0);
    if (&row == chosen) continue;
    const bool may_be_within =
        row.batch_size < chosen->batch_size && high_of(row) >= (1 - tolerance) * surely_reached;
    const bool may_outrun = low_of(*chosen) < (1 - tolerance) * high_of(row);
    if (may_be_within || may_outrun) s.contenders.push_back(row.batch_size);
  }
  std::sort(s.contenders.begin(), s.contenders.end());
  // A row of a single timed step has an interval of no level at all: its
  // point says nothing of how sure the choice is.
  if (s.contenders.empty() && level > 0) s.confidence = level;
  const std::string ci = chosen->samples_per_s_ci.n > 0
                             ? fmt::format(" [{:.1f}, {:.1f}]", chosen->samples_per_s_ci.low,
                                           chosen->samples_per_s_ci.high)
                             : "";
  if (chosen == &*best) {
    s.reason = fmt::format("throughput: {} is the fastest batch measured ({:.1f} samples/s{})",
                           chosen->batch_size, chosen->samples_per_s, ci);
  } else {
    s.reason = fmt::format("throughput: {} reaches {:.1f} % of the best measured ({:.1f} samples/s "
                           "at {}); past it a larger batch buys less than {:.0f} % more speed and "
                           "only costs memory",
                           chosen->batch_size, 100 * chosen->samples_per_s / best->samples_per_s,
                           best->samples_per_s, best->batch_size, tolerance * 100);
  }
  if (s.confidence) {
    s.reason += chosen == &*best
                    ? fmt::format("; no smaller batch comes within {:.0f} % of it, at {} confidence",
                                  tolerance * 100, format_level(*s.confidence))
                    : fmt::format(", at {} confidence", format_level(*s.confidence));
  } else if (s.contenders.empty()) {
    s.reason += "; inconclusive: a row was timed over too few steps to give an interval (the "
                "time budget ran short), so a re-measurement could choose otherwise";
  } else {
    std::vector<std::string> names;
    for (int64_t b : s.contenders) names.push_back(std::to_string(b));
    s.reason += fmt::format("; inconclusive at {}: the intervals of batch {} cannot be told "
                            "apart from it within {:.0f} %, so a re-measurement could choose "
                            "otherwise",
                            format_level(kConfidenceLevel), fmt::join(names, ", "),
                            tolerance * 100);
  }
  return s;
}

std::optional<double> rows_confidence(const std::vector<SweepRow>& rows) {
  double level = 1;
  for (const auto& row : rows) {
    if (row.noisy) return std::nullopt;
    if (row.samples_per_s_ci.n > 0) level = std::min(level, row.samples_per_s_ci.level);
  }
  if (!(level > 0)) return std::nullopt;  // a row of one timed step
  return level;
}

Diagnosis diagnose(const std::vector<SweepRow>& rows, const Selection& chosen, double tolerance) {
  TORCH_CHECK(!rows.empty(), "diagnose: no sweep rows");
  std::vector<SweepRow> sorted = rows;
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.batch_size < b.batch_size; });
  const SweepRow& top = sorted.back();
  const auto at = std::find_if(sorted.begin(), sorted.end(),
                               [&](const auto& r) { return r.batch_size == chosen.batch_size; });
  const SweepRow& pick = at != sorted.end() ? *at : top;
  if (top.batch_size < kMemoryBoundBatch) {
    return {"memory-bound",
            fmt::format("memory-bound: only {} sample(s) fit beside the model and its optimizer "
                        "state; use mixed precision, a smaller model or a larger device",
                        top.batch_size)};
  }
  // A reading of speed needs enough rows, and rows steady enough to read.
  std::vector<int64_t> noisy;
  for (const auto& r : sorted) {
    if (r.noisy) noisy.push_back(r.batch_size);
  }
  if (sorted.size() < kDiagnosisMinRows) {
    return {"inconclusive",
            fmt::format("inconclusive: {} of the sweep's sizes timed, too few to read how "
                        "throughput grows with the batch (needs {})",
                        sorted.size(), kDiagnosisMinRows)};
  }
  if (pick.noisy || top.noisy || sorted.size() - noisy.size() < kDiagnosisMinRows) {
    return {"inconclusive",
            fmt::format("inconclusive: the timings of batch {} are too noisy (interval wider "
                        "than ±{:.0f} %) to read what holds throughput back",
                        fmt::join(noisy, ", "), 100 * kNoisyHalfWidth)};
  }
  if (1 - pick.busy > kInputBoundWait) {
    return {"input-bound",
            fmt::format("input-bound: the step waits for data {:.0f} % of the time at batch {}; "
                        "add loader workers or pinned memory",
                        100 * (1 - pick.busy), pick.batch_size)};
  }
  {
    const SweepRow& below = sorted[sorted.size() - 2];
    const bool fastest_is_largest = std::all_of(sorted.begin(), sorted.end(), [&](const auto& r) {
      return r.samples_per_s <= top.samples_per_s;
    });
    if (fastest_is_largest && top.samples_per_s > below.samples_per_s * (1 + tolerance)) {
      return {"small-batch-bound",
              fmt::format("small-batch-bound: throughput still rises at {}, the largest batch "
                          "that fits ({:+.0f} % over {}); mixed precision would fit a larger "
                          "batch, gradient accumulation reaches a larger logical one",
                          top.batch_size,
                          100 * (top.samples_per_s / below.samples_per_s - 1), below.batch_size)};
    }
  }
  return {"compute-bound",
          fmt::format("compute-bound: throughput levels off by batch {} and the step computes "
                      "{:.0f} % of the time; a larger batch would not run faster",
                      pick.batch_size, 100 * pick.busy)};
}

namespace {

/// Adds `more`'s timed steps to `pooled`'s and summarizes them again.
void pool_steps(TrialResult& pooled, const TrialResult& more) {
  pooled.step_seconds.insert(pooled.step_seconds.end(), more.step_seconds.begin(),
                             more.step_seconds.end());
  pooled.wait_seconds.insert(pooled.wait_seconds.end(), more.wait_seconds.begin(),
                             more.wait_seconds.end());
  pooled.steps_run += more.steps_run;
  pooled.warmup_steps_run += more.warmup_steps_run;
  pooled.peak_bytes = std::max(pooled.peak_bytes, more.peak_bytes);
  summarize_steps(pooled);
  pooled.noise_cause = more.noisy ? more.noise_cause : pooled.noise_cause;
}

}  // namespace

SweepOutcome run_sweep(const std::function<TrialResult(const TrialOptions&)>& trial,
                       const std::vector<int64_t>& grid,
                       const std::vector<TrialResult>& search_trials,
                       const SweepOptions& options) {
  const Clock& clock = options.clock != nullptr ? *options.clock : steady_clock();
  const auto seconds_left = [&] { return options.deadline_s - clock.now_s(); };
  // A trial of one round: its share of the row's calibration, so that the
  // rounds together time at least `kSweepTimedSteps` steps and
  // `kSweepMinTimedSeconds` a row.
  const auto calibrated = [](int64_t batch, double slice_s, int64_t rounds) {
    return TrialOptions()
        .batch_size(batch)
        .steps((kSweepTimedSteps + rounds - 1) / rounds)
        .warmup_steps(kSweepWarmupSteps)
        .max_warmup_steps(kSweepMaxWarmupSteps)
        .min_time_s(kSweepMinTimedSeconds / static_cast<double>(rounds))
        .max_time_s(std::max(slice_s, 0.0));
  };
  SweepOutcome outcome;
  std::map<int64_t, TrialResult> timed;  // by batch size, steps pooled
  std::vector<int64_t> to_time;          // in the grid's order
  for (int64_t batch : grid) {
    const auto reused = std::find_if(search_trials.begin(), search_trials.end(), [&](const auto& t) {
      return t.batch_size == batch && timed_well_enough(t);
    });
    if (reused != search_trials.end()) {
      timed[batch] = *reused;
    } else {
      to_time.push_back(batch);
    }
  }
  // The sizes in interleaved rounds: a burst of load falls on every size
  // alike, where rows timed one after another let it hit some and not
  // others. A size whose first slice is too short once another row is
  // timed is left out (the grid's order puts the small sizes last).
  RoundsOptions rounds;
  rounds.clock = &clock;
  rounds.deadline_s = clock.now_s() + std::max(0.0, seconds_left()) * (1 - kSweepRemeasureShare);
  rounds.min_rounds = rounds.max_rounds = kSweepRounds;
  run_interleaved_rounds(
      to_time.size(),
      [&](size_t i, double slice) {
        const int64_t batch = to_time[i];
        const bool first = timed.count(batch) == 0;
        if (!timed.empty() && slice < kSweepMinSliceSeconds) {
          if (first) ++outcome.sizes_left_out;
          return RoundTrial::kDrop;
        }
        TrialResult result = trial(calibrated(batch, slice, kSweepRounds));
        if (!result.fits) return RoundTrial::kDrop;
        if (first) {
          timed[batch] = std::move(result);
        } else {
          pool_steps(timed[batch], result);
        }
        return RoundTrial::kKeep;
      },
      {}, rounds);
  const auto rows_of = [&] {
    std::vector<SweepRow> rows;
    for (const auto& [batch, t] : timed) rows.push_back(sweep_row(t));
    return rows;
  };
  // The choice's contenders again, one interleaved round at a time, until
  // they are told apart, their steps pooled with the rounds' before.
  while (options.objective == Objective::kThroughput && !timed.empty() &&
         outcome.remeasure_rounds < kSweepMaxRemeasureRounds) {
    const std::vector<SweepRow> rows = rows_of();
    const Selection s = select_batch(rows, Objective::kThroughput, options.tolerance);
    if (s.confidence) break;
    std::vector<int64_t> again = s.contenders;
    again.push_back(s.batch_size);
    const auto best = std::max_element(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
      return a.samples_per_s < b.samples_per_s;
    });
    again.push_back(best->batch_size);
    std::sort(again.begin(), again.end());
    again.erase(std::unique(again.begin(), again.end()), again.end());
    if (seconds_left() / static_cast<double>(again.size()) < kSweepMinSliceSeconds) break;
    ++outcome.remeasure_rounds;
    RoundsOptions one_round;
    one_round.clock = &clock;
    one_round.deadline_s = options.deadline_s;
    run_interleaved_rounds(
        again.size(),
        [&](size_t i, double slice) {
          const TrialResult more = trial(calibrated(again[i], slice, 1));
          if (more.fits) pool_steps(timed[again[i]], more);
          return RoundTrial::kKeep;
        },
        {}, one_round);
  }
  outcome.rows = rows_of();
  return outcome;
}

void add_flops(std::vector<SweepRow>& rows, double forward_flops_per_sample,
               double peak_flops_per_s) {
  for (auto& row : rows) {
    row.flops_per_s = kTrainingFlopsPerForwardFlop * forward_flops_per_sample * row.samples_per_s;
    if (peak_flops_per_s > 0) row.mfu = *row.flops_per_s / peak_flops_per_s;
  }
}

}  // namespace batchtune
