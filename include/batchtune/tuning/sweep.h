#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/tuning/search.h"
#include "batchtune/step/trial.h"

namespace batchtune {

/// Timed steps per sweep trial, after `kSweepWarmupSteps` untimed ones; more
/// are run (up to `kSweepMaxSteps`) while the spread stays above
/// `kSweepTargetSpread`.
constexpr int64_t kSweepTimedSteps = 5;
constexpr int64_t kSweepWarmupSteps = 2;
constexpr int64_t kSweepMaxSteps = 20;
constexpr double kSweepTargetSpread = 0.05;
/// Fast steps are timed again with enough steps to fill this many seconds
/// (up to `kSweepMaxAutoSteps`), as google/benchmark grows its iterations:
/// a sub-millisecond step timed 5 times is mostly noise.
/// One second: on shared machines shorter timings differed by 10-40 % from
/// run to run (bench/sweep_quality).
constexpr double kSweepMinTimedSeconds = 1.0;
constexpr int64_t kSweepMaxAutoSteps = 2000;
/// Default share of the best throughput within which the smallest batch is
/// chosen: past that point a larger batch only costs memory.
constexpr double kDefaultThroughputTolerance = 0.02;
/// A step that waits for data more than this share of its time is input-bound.
constexpr double kInputBoundWait = 0.05;

/// One batch size of the sweep: what training at that size looks like.
struct SweepRow {
  int64_t batch_size = 0;
  AmpMode amp = AmpMode::kOff;      ///< the precision it was timed at
  double samples_per_s = 0;         ///< median
  double samples_per_s_spread = 0;  ///< interquartile range / median
  /// Sequences: samples/s × tokens per sample (0 where the input is no sequence).
  double tokens_per_s = 0;
  double step_ms = 0;               ///< median
  double busy = 0;                  ///< compute / (compute + data wait)
  std::optional<double> utilization;          ///< device utilization %, mean
  int64_t peak_bytes = 0;
  std::optional<double> energy_j_per_sample;
  std::optional<double> flops_per_s;          ///< achieved, where the model's FLOPs are known
  int64_t steps = 0;                          ///< training steps this row ran
};

/// Batch sizes the sweep times: powers of two from 1 up to `max_batch`, and
/// `max_batch` itself.
std::vector<int64_t> sweep_grid(int64_t max_batch);

/// A sweep row from a trial that fitted.
SweepRow sweep_row(const TrialResult& trial);

/// Training FLOPs per sample: about 3x the forward pass (the backward pass
/// costs about twice the forward).
constexpr double kTrainingFlopsPerForwardFlop = 3;

/// Timed steps a trial needs to fill `kSweepMinTimedSeconds`, predicted from
/// the steps it ran (never fewer than it ran).
int64_t steps_needed(const TrialResult& trial);

/// Whether a search trial already timed `batch` well enough to stand as its
/// sweep row.
bool timed_well_enough(const TrialResult& trial);

/// What the sweep chooses for. `kGoodput` (throughput × statistical
/// efficiency, see goodput.h) and `kEnergy` (the Zeus cost, see energy.h)
/// need more than the rows and are chosen by `select_goodput` and
/// `select_energy`.
enum class Objective { kThroughput, kMaxFit, kGoodput, kEnergy };
/// `throughput`, `max-fit`, `goodput` or `energy`; throws `batchtune::Error`.
Objective parse_objective(const std::string& name);
std::string to_string(Objective objective);

/// The chosen batch size and why, in plain words.
struct Selection {
  int64_t batch_size = 0;
  std::string reason;
};

/// `throughput`: the smallest batch whose throughput is within `tolerance` of
/// the best measured. `max-fit`: the largest row. Rows must not be empty;
/// the objective one of those two.
Selection select_batch(const std::vector<SweepRow>& rows, Objective objective,
                       double tolerance = kDefaultThroughputTolerance);

/// What holds throughput back, as a kind and a sentence.
struct Diagnosis {
  /// compute-bound, input-bound, memory-bound, small-batch-bound; tune adds
  /// max-batch-bound (the --max-batch cap, not memory, stopped the search)
  std::string kind;
  std::string text;
};

/// Reads the sweep: waiting for data, throughput still rising at the largest
/// batch that fits, no room to grow, or saturated compute.
Diagnosis diagnose(const std::vector<SweepRow>& rows, const Selection& chosen,
                   double tolerance = kDefaultThroughputTolerance);

/// Runs the sweep: a trial per grid size, more timed steps where the spread is
/// large, reusing search trials that were timed well enough. `trial` runs one
/// trial with the given options; rows come back in batch-size order, failed
/// sizes left out.
std::vector<SweepRow> run_sweep(const std::function<TrialResult(const TrialOptions&)>& trial,
                                const std::vector<int64_t>& grid,
                                const std::vector<TrialResult>& search_trials = {});

/// Fills each row's achieved FLOP/s from the model's forward FLOPs per sample.
void add_flops(std::vector<SweepRow>& rows, double forward_flops_per_sample);

}  // namespace batchtune
