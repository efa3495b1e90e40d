#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/common/clock.h"
#include "batchtune/common/estimate.h"
#include "batchtune/step/trial.h"
#include "batchtune/tuning/search.h"

namespace batchtune {

/// A sweep row is timed in `kSweepRounds` interleaved rounds, a calibrated
/// trial each (see `TrialOptions`): together at least `kSweepTimedSteps`
/// timed steps, each trial after `kSweepWarmupSteps` untimed ones (more, up
/// to `kSweepMaxWarmupSteps`, while the step time still falls), and timed
/// steps until the rounds fill `kSweepMinTimedSeconds` — within the trial's
/// slice of the sweep's time.
constexpr int64_t kSweepTimedSteps = 5;
constexpr int64_t kSweepWarmupSteps = 1;
constexpr int64_t kSweepMaxWarmupSteps = 10;
/// One second, as google/benchmark's default minimum time: on shared
/// machines shorter timings differed by 10-40 % from run to run
/// (bench/sweep_quality).
constexpr double kSweepMinTimedSeconds = 1.0;
/// Rounds over the sweep's sizes: load that comes and goes in bursts lands
/// on a round of every size rather than on all of one size's steps (rows
/// timed one after another took a plan of micro-batch 1 x 64 from a burst);
/// three, so that a burst that spans one round leaves two for the fastest step.
constexpr int64_t kSweepRounds = 3;
/// Share of the sweep's time kept for re-measuring the rows the choice
/// cannot yet tell apart (see `run_sweep`).
constexpr double kSweepRemeasureShare = 0.3;
/// Rounds of interleaved re-measurement at most.
constexpr int64_t kSweepMaxRemeasureRounds = 4;
/// A row's slice below this is not worth starting when another row is
/// already timed: the trial could give no more than a warm-up and one step.
constexpr double kSweepMinSliceSeconds = 0.05;
/// Default share of the best throughput within which the smallest batch is
/// chosen: past that point a larger batch only costs memory.
constexpr double kDefaultThroughputTolerance = 0.02;
/// A step that waits for data more than this share of its time is input-bound.
constexpr double kInputBoundWait = 0.05;

/// One batch size of the sweep: what training at that size looks like.
struct SweepRow {
  int64_t batch_size = 0;
  AmpMode amp = AmpMode::kOff;      ///< the precision it was timed at
  /// The row's speed: batch size over its fastest timed step, the figure
  /// load cannot inflate (see `sweep_row`); `samples_per_s_ci` and
  /// `step_ms` stay the median's.
  double samples_per_s = 0;
  double samples_per_s_spread = 0;  ///< interquartile range / median
  /// Sequences: samples/s × tokens per sample (0 where the input is no sequence).
  double tokens_per_s = 0;
  double step_ms = 0;               ///< median
  /// The medians with their confidence intervals (see `Estimate`).
  Estimate samples_per_s_ci;
  Estimate step_ms_ci;
  /// The interval is too wide to decide on, and the likely cause.
  bool noisy = false;
  std::string noise_cause;
  double busy = 0;                  ///< compute / (compute + data wait)
  std::optional<double> utilization;          ///< device utilization %, mean
  int64_t peak_bytes = 0;
  std::optional<double> energy_j_per_sample;
  std::optional<double> flops_per_s;          ///< achieved, where the model's FLOPs are known
  /// Model FLOPs utilization: `flops_per_s` over the device's peak at the
  /// row's precision (see `PeakFlops`), where both are known.
  std::optional<double> mfu;
  int64_t steps = 0;                          ///< training steps this row ran
};

/// Batch sizes the sweep times: powers of two from 1 up to `max_batch`, and
/// `max_batch` itself.
std::vector<int64_t> sweep_grid(int64_t max_batch);

/// Divisors of a target batch timed at most, beside the grid: the largest
/// ones a plan may take to reach the target exactly.
constexpr int64_t kTargetDivisors = 3;

/// The sweep's sizes in the order they are timed: the largest first (when
/// the budget runs out, the sizes left out are small ones, which throughput
/// rarely favours); with a target batch of `target_per_process` samples a
/// process, then the largest `kTargetDivisors` divisors of it up to
/// `max_batch`, so that a plan that reaches the target exactly with a smaller
/// micro-batch knows what it costs; then the rest of `sweep_grid`.
std::vector<int64_t> sweep_order(int64_t max_batch, int64_t target_per_process = 0);

/// A sweep row from a trial that fitted: its speed from the fastest timed
/// step (Chen & Revels, "Robust benchmarking in noisy environments", 2016:
/// load only ever adds time), its interval and spread the median's.
SweepRow sweep_row(const TrialResult& trial);

/// Training FLOPs per sample: about 3x the forward pass (the backward pass
/// costs about twice the forward).
constexpr double kTrainingFlopsPerForwardFlop = 3;

/// Whether a search trial already timed its batch well enough to stand as
/// its sweep row: enough timed steps and an interval that is not noisy.
bool timed_well_enough(const TrialResult& trial);

/// What the sweep chooses for. `kGoodput` (throughput × statistical
/// efficiency, see goodput.h) and `kEnergy` (the Zeus cost, see energy.h)
/// need more than the rows and are chosen by `select_goodput` and
/// `select_energy`.
enum class Objective { kThroughput, kMaxFit, kGoodput, kEnergy };
/// `throughput`, `max-fit`, `goodput` or `energy`; throws `batchtune::Error`.
Objective parse_objective(const std::string& name);
std::string to_string(Objective objective);

/// The chosen batch size, why, in plain words, and how sure.
struct Selection {
  int64_t batch_size = 0;
  std::string reason;
  /// The confidence the choice reached (the lowest level of the intervals
  /// it rests on), or nullopt: inconclusive, the intervals could not tell
  /// the contenders apart (`contenders` names them).
  std::optional<double> confidence;
  /// Throughput: the rows whose intervals leave the choice open (empty when
  /// it is conclusive).
  std::vector<int64_t> contenders;
};

/// `throughput`: the smallest batch whose median throughput is within
/// `tolerance` of the best measured. It is conclusive when every smaller
/// row's interval lies below (1 − tolerance) × the best's, and the chosen
/// row's (when it is not the best) above (1 − tolerance) × the best's upper
/// end; else the rows in doubt are `contenders` and the confidence is
/// inconclusive. `max-fit`: the largest row (conclusive: it fitted). Rows
/// must not be empty; the objective one of those two.
Selection select_batch(const std::vector<SweepRow>& rows, Objective objective,
                       double tolerance = kDefaultThroughputTolerance);

/// The confidence of a choice that reads every row by more than its speed
/// (goodput, energy): the lowest level of the rows' intervals, or nullopt
/// (inconclusive) when one of them is noisy or was timed over one step.
std::optional<double> rows_confidence(const std::vector<SweepRow>& rows);

/// What holds throughput back, as a kind and a sentence.
struct Diagnosis {
  /// compute-bound, input-bound, memory-bound, small-batch-bound; tune adds
  /// max-batch-bound (the --max-batch cap, not memory, stopped the search)
  std::string kind;
  std::string text;
};

/// Reads the sweep: waiting for data, throughput still rising at the largest
/// batch that fits, no room to grow, or saturated compute. A reading of
/// speed (all but memory-bound) needs `kDiagnosisMinRows` rows that are not
/// noisy; with fewer the kind is `inconclusive` and the text says why.
constexpr size_t kDiagnosisMinRows = 3;
Diagnosis diagnose(const std::vector<SweepRow>& rows, const Selection& chosen,
                   double tolerance = kDefaultThroughputTolerance);

/// How the sweep spends its time: its deadline on `clock` (the end of the
/// sweep's share of the tune's budget), and what the re-measurement decides.
struct SweepOptions {
  /// Null for the steady clock.
  const Clock* clock = nullptr;
  double deadline_s = std::numeric_limits<double>::infinity();
  /// Re-measure the rows `select_batch` cannot tell apart, for this objective
  /// and tolerance (only `kThroughput` re-measures).
  Objective objective = Objective::kThroughput;
  double tolerance = kDefaultThroughputTolerance;
};

/// What a sweep did besides its rows.
struct SweepOutcome {
  std::vector<SweepRow> rows;  ///< in batch-size order, failed sizes left out
  /// Sizes of the grid that were not timed: the time ran out.
  int64_t sizes_left_out = 0;
  /// Rounds of re-measurement run, and whether the choice was still open after them.
  int64_t remeasure_rounds = 0;
};

/// Runs the sweep: `kSweepRounds` interleaved rounds over the grid's sizes
/// (each round in the grid's order, see `run_interleaved_rounds`), a trial
/// each within its slice of what is left until the deadline (less
/// `kSweepRemeasureShare`), their steps pooled by size, reusing search
/// trials that were timed well enough; then, while the choice is
/// inconclusive and time is left, the contenders again, one interleaved
/// round at a time, pooled the same way. `trial` runs one trial with the
/// given options.
SweepOutcome run_sweep(const std::function<TrialResult(const TrialOptions&)>& trial,
                       const std::vector<int64_t>& grid,
                       const std::vector<TrialResult>& search_trials = {},
                       const SweepOptions& options = {});

/// Fills each row's achieved FLOP/s from the model's forward FLOPs per
/// sample, and its model FLOPs utilization where `peak_flops_per_s` > 0.
void add_flops(std::vector<SweepRow>& rows, double forward_flops_per_sample,
               double peak_flops_per_s = 0);

}  // namespace batchtune
