#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "batchtune/monitoring/energy.h"
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
  /// Why utilization is missing, when it is ("libnvidia-ml.so.1 not found").
  std::string utilization_note;
  /// False while the run was interrupted before it finished.
  bool complete = true;
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

/// One self-contained HTML page (inline SVG, no scripts): throughput and
/// memory against batch size with the capacity and the chosen point, and
/// utilization over the run.
std::string html_report(const TuneReport& report);

}  // namespace batchtune
