#include "batchtune/tuning/sweep.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "batchtune/common/error.h"

namespace batchtune {
namespace {

// Predicted steps get this headroom, so that the longer trial lands past the
// minimum time rather than just short of it (google/benchmark uses 1.4 too).
constexpr double kStepGrowthHeadroom = 1.4;

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

SweepRow sweep_row(const TrialResult& trial) {
  SweepRow row;
  row.batch_size = trial.batch_size;
  row.amp = trial.amp;
  row.samples_per_s = trial.samples_per_s;
  row.tokens_per_s = trial.tokens_per_s;
  row.step_ms = trial.step_ms;
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

int64_t steps_needed(const TrialResult& trial) {
  const auto timed = static_cast<int64_t>(trial.step_seconds.size());
  double total = 0;
  for (double s : trial.step_seconds) total += s;
  if (timed == 0 || total <= 0 || total >= kSweepMinTimedSeconds) return timed;
  const double predicted = static_cast<double>(timed) * kSweepMinTimedSeconds / total *
                           kStepGrowthHeadroom;
  return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(predicted)), timed,
                             kSweepMaxAutoSteps);
}

bool timed_well_enough(const TrialResult& trial) {
  return trial.fits && static_cast<int64_t>(trial.step_seconds.size()) >= kSweepTimedSteps &&
         trial.step_ms_spread <= kSweepTargetSpread;
}

Objective parse_objective(const std::string& name) {
  if (name == "throughput") return Objective::kThroughput;
  if (name == "max-fit") return Objective::kMaxFit;
  if (name == "goodput") return Objective::kGoodput;
  if (name == "energy") return Objective::kEnergy;
  throw Error(fmt::format(
      "--objective: unknown objective '{}'; use throughput, max-fit, goodput or energy", name));
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
    throw Error(fmt::format("--tolerance: must be at least 0 and below 1, got {}", tolerance));
  }
  const auto largest = std::max_element(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.batch_size < b.batch_size;
  });
  if (objective == Objective::kMaxFit) {
    return {largest->batch_size,
            fmt::format("max-fit: {} is the largest batch that fits ({:.1f} samples/s)",
                        largest->batch_size, largest->samples_per_s)};
  }
  const auto best = std::max_element(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.samples_per_s < b.samples_per_s;
  });
  const double floor = best->samples_per_s * (1 - tolerance);
  const SweepRow* chosen = &*best;
  for (const auto& row : rows) {
    if (row.samples_per_s >= floor && row.batch_size < chosen->batch_size) chosen = &row;
  }
  if (chosen->batch_size == best->batch_size) {
    return {chosen->batch_size,
            fmt::format("throughput: {} is the fastest batch measured ({:.1f} samples/s); no "
                        "smaller batch comes within {:.0f} % of it",
                        chosen->batch_size, chosen->samples_per_s, tolerance * 100)};
  }
  return {chosen->batch_size,
          fmt::format("throughput: {} reaches {:.1f} % of the best measured ({:.1f} samples/s "
                      "at {}); past it a larger batch buys less than {:.0f} % more speed and "
                      "only costs memory",
                      chosen->batch_size, 100 * chosen->samples_per_s / best->samples_per_s,
                      best->samples_per_s, best->batch_size, tolerance * 100)};
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
  if (1 - pick.busy > kInputBoundWait) {
    return {"input-bound",
            fmt::format("input-bound: the step waits for data {:.0f} % of the time at batch {}; "
                        "add loader workers or pinned memory",
                        100 * (1 - pick.busy), pick.batch_size)};
  }
  if (top.batch_size < kMemoryBoundBatch) {
    return {"memory-bound",
            fmt::format("memory-bound: only {} sample(s) fit beside the model and its optimizer "
                        "state; use mixed precision, a smaller model or a larger device",
                        top.batch_size)};
  }
  if (sorted.size() >= 2) {
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

std::vector<SweepRow> run_sweep(const std::function<TrialResult(const TrialOptions&)>& trial,
                                const std::vector<int64_t>& grid,
                                const std::vector<TrialResult>& search_trials) {
  std::vector<SweepRow> rows;
  for (int64_t batch : grid) {
    const auto reused = std::find_if(search_trials.begin(), search_trials.end(), [&](const auto& t) {
      return t.batch_size == batch && timed_well_enough(t);
    });
    if (reused != search_trials.end()) {
      rows.push_back(sweep_row(*reused));
      continue;
    }
    TrialResult result = trial(
        TrialOptions().batch_size(batch).steps(kSweepTimedSteps).warmup_steps(kSweepWarmupSteps));
    int64_t steps = result.steps_run;
    const int64_t needed = result.fits ? steps_needed(result) : 0;
    if (needed > kSweepTimedSteps) {
      // Fast steps: time again, long enough for the clock and the noise.
      TrialResult longer = trial(
          TrialOptions().batch_size(batch).steps(needed).warmup_steps(kSweepWarmupSteps));
      steps += longer.steps_run;
      if (longer.fits) result = longer;
    } else if (result.fits && result.step_ms_spread > kSweepTargetSpread) {
      // A noisy machine: time again with more steps and keep the steadier one.
      TrialResult longer = trial(TrialOptions()
                                     .batch_size(batch)
                                     .steps(kSweepMaxSteps - kSweepWarmupSteps)
                                     .warmup_steps(kSweepWarmupSteps));
      steps += longer.steps_run;
      if (longer.fits && longer.step_ms_spread < result.step_ms_spread) result = longer;
    }
    if (!result.fits) continue;
    SweepRow row = sweep_row(result);
    row.steps = steps;
    rows.push_back(row);
  }
  return rows;
}

void add_flops(std::vector<SweepRow>& rows, double forward_flops_per_sample) {
  for (auto& row : rows) {
    row.flops_per_s = kTrainingFlopsPerForwardFlop * forward_flops_per_sample * row.samples_per_s;
  }
}

}  // namespace batchtune
