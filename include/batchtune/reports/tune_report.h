#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "batchtune/monitoring/energy.h"
#include "batchtune/plan/plan.h"
#include "batchtune/tuning/goodput.h"
#include "batchtune/training/noise_scale.h"
#include "batchtune/tuning/search.h"
#include "batchtune/tuning/sweep.h"

namespace batchtune {

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
  std::string stage;  ///< "search", "sweep"
};

/// Everything `batchtune tune` found, as plain data; the console table, the
/// JSON and the HTML report are views of it.
struct TuneReport {
  std::string workload;  ///< "resnet18 (11181642 parameters)"
  std::string device;    ///< "cpu", "cuda:0"
  int threads = 0;
  SearchResult search;
  std::vector<SweepRow> sweep;
  Objective objective = Objective::kThroughput;
  Selection selection;
  Diagnosis diagnosis;
  int64_t capacity_bytes = 0;
  int64_t usable_bytes = 0;
  double margin = 0;
  std::vector<UtilizationPoint> timeline;
  /// Which trial ran when, on the same clock as `timeline`.
  std::vector<TimelinePhase> phases;
  /// Why utilization is missing, when it is ("libnvidia-ml.so.1 not found").
  std::string utilization_note;
  /// False while the run was interrupted before it finished.
  bool complete = true;
  /// "SIGINT", "SIGTERM" when interrupted.
  std::string interrupted_by;
  /// The plan tune recommends, when it got that far.
  std::optional<Plan> plan;
  /// The command line that made the report, for the record; empty: not shown.
  std::string command_line;
  /// When the report was made ("2026-12-01 20:45 UTC"); empty: now.
  std::string generated_at;
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
};

/// The JSON of `batchtune tune --json`: the search's fields (`max_batch_size`,
/// `search`, `trials`) and `sweep`, `chosen_batch_size`, `objective`,
/// `diagnosis`, `complete`, `energy_note`; with `--objective goodput`
/// `noise_scale`, `noise_scale_run` and `goodput`; with `energy`, `eta` and
/// `energy_cost`.
nlohmann::json to_json(const TuneReport& report);

/// The sweep as a console table, the chosen row marked, then the reason and
/// the diagnosis.
void print_sweep(std::ostream& out, const TuneReport& report);

/// The goodput candidates as a console table, the chosen one marked.
void print_goodput(std::ostream& out, const TuneReport& report);

/// One self-contained HTML page (inline SVG, no scripts) to send a
/// colleague: the verdict (or that the run was interrupted), the plan,
/// throughput with its spread as error bars, memory against the capacity and
/// the usable limit with the failed trials, GFLOP/s, utilization over the
/// run with the batch that ran shaded, the sweep and search-trial tables, and
/// the command line, batchtune's version and the date.
std::string html_report(const TuneReport& report);

}  // namespace batchtune
