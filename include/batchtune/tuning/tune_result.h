#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "batchtune/monitoring/peak_flops.h"
#include "batchtune/plan/plan.h"
#include "batchtune/step/amp.h"
#include "batchtune/step/trial.h"
#include "batchtune/tuning/energy.h"
#include "batchtune/tuning/goodput.h"
#include "batchtune/tuning/loader_tuning.h"
#include "batchtune/tuning/noise_run.h"
#include "batchtune/tuning/search.h"
#include "batchtune/tuning/sweep.h"
#include "batchtune/tuning/token_budget.h"

namespace batchtune {

/// The phases of a tune, in order. `kLengths` runs only for a length range
/// (`int64:16..512`): the memory model over batch and length, and the token
/// budget (see `plan_token_budget`).
enum class TunePhase { kPrecision, kSearch, kLengths, kSweep, kNoise, kEval, kLoader, kPlan };
std::string to_string(TunePhase phase);

/// One reading of device utilization during the run, for the timeline plot.
struct UtilizationPoint {
  double seconds = 0;  ///< since the run started
  std::optional<double> utilization;
};

/// What ran from `start_s` to `end_s` (seconds since the run started): a
/// search or sweep trial at `batch_size`, for the utilization plot.
struct TimelinePhase {
  double start_s = 0;
  double end_s = 0;
  int64_t batch_size = 0;
  std::string stage;  ///< "precision", "search", "sweep"
};

/// A compiled model's compilation (`torch.compile`, from Python): measured
/// apart from the trials, in a phase of its own before the time budget's.
struct CompileRecord {
  /// Seconds spent compiling: the compile phase (the first step at each
  /// precision the tune runs) and any graph compiled later, in a trial.
  double seconds = 0;
  /// Graphs compiled in the compile phase (a frame and its backward each).
  int64_t graphs = 0;
  /// Graphs compiled after it, inside the trials: a model that specialises
  /// on the batch size (or a precision the phase did not warm).
  int64_t recompiles = 0;
  /// One line: how the phase ran and what its time was charged to.
  std::string note;
};

/// Everything a tune found, as plain data; the console table, the JSON
/// (`to_json`, exactly what `batchtune tune --json` writes) and the HTML
/// report are views of it.
struct TuneResult {
  std::string workload;  ///< "resnet18 (11181642 parameters)"
  std::string device;    ///< "cpu", "cuda:0"
  int threads = 0;
  /// The precision every trial and sweep row ran at, and why.
  AmpMode amp = AmpMode::kOff;
  std::string amp_reason;
  /// The level the precision's measurement reached (1 where nothing was
  /// measured); nullopt: inconclusive, fp32 kept.
  std::optional<double> amp_confidence = 1.0;
  SearchResult search;
  /// Data parallel: this rank's own largest batch (the search's is the job's,
  /// the smallest rank's).
  std::optional<int64_t> rank_max_batch_size;
  std::vector<SweepRow> sweep;
  /// The largest evaluation batch: the same search over forward-only
  /// trials (no gradients, no optimizer state, the model in eval mode), as
  /// Lightning's finder sizes its validation loaders; nullopt where it did
  /// not run (search only, a subject without a forward-only step).
  std::optional<SearchResult> eval_search;
  Objective objective = Objective::kThroughput;
  Selection selection;
  Diagnosis diagnosis;
  int64_t capacity_bytes = 0;
  int64_t usable_bytes = 0;
  double margin = 0;
  std::vector<UtilizationPoint> timeline;
  /// Which trial ran when, on the same clock as `timeline`.
  std::vector<TimelinePhase> phases;
  /// The command line that made the run, for the report; empty: not shown.
  std::string command_line;
  /// When the report was made ("2026-12-01 20:45 UTC"); empty: now.
  std::string generated_at;
  /// How utilization was read, in one short line, and what is missing.
  std::string utilization_note;
  /// The same with every reason a reading is unavailable (NVML's and RAPL's
  /// errors in full).
  std::string utilization_details;
  /// False when the run was stopped (an interrupt) before it finished:
  /// what was measured until then is kept.
  bool complete = true;
  /// Why it stopped early ("SIGINT"); empty when complete.
  std::string interrupted_by;
  /// Only the search ran (`TuneOptions::search_only`).
  bool search_only = false;
  /// The time budget of the whole run, and what each phase spent.
  double time_budget_s = 0;
  std::vector<std::pair<TunePhase, double>> phase_seconds;
  /// Why the run took longer than its budget (plus `kTimeBudgetTolerance`);
  /// empty when it did not.
  std::string budget_note;
  /// A compiled model's compilation; none for an eager one.
  std::optional<CompileRecord> compile;
  /// The device's peak that the sweep rows' `mfu` divides by; none (and
  /// `mfu_note` says why) on the CPU, for a GPU the table does not know, or
  /// where the model's FLOPs are not known.
  std::optional<PeakFlops> peak_flops;
  std::string mfu_note;
  /// `--objective goodput`: the noise-scale run, on what data, the base
  /// batch B0 of the efficiency, every candidate global batch and the choice.
  std::optional<NoiseScaleMeasurement> noise;
  std::string noise_data;
  int64_t goodput_base_batch = 0;
  std::vector<GoodputCandidate> goodput;
  std::optional<GoodputCandidate> goodput_choice;
  /// "energy per sample unavailable, because …" where a row has no energy
  /// reading; empty when every row has one.
  std::string energy_note;
  /// `--objective energy`: η and the Zeus cost of each row with a reading.
  double eta = kDefaultEta;
  std::vector<EnergyCost> energy_costs;
  /// The input pipeline, timed on the data at the chosen micro-batch.
  LoaderTuning loader;
  /// A length range: the memory model over batch and length, its checks,
  /// and the token budget and buckets it planned. None for fixed shapes.
  std::optional<TokenBudgetResult> tokens;
  /// The plan to train with; none for a search only, or when nothing fits.
  std::optional<Plan> plan;
};

}  // namespace batchtune
