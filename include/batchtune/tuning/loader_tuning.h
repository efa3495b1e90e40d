#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/plan/plan.h"
#include "batchtune/tuning/sweep.h"

namespace batchtune {

class Dataset;
class TrialRunner;

/// The loader keeps up when the step waits for data less than
/// `kInputBoundWait` of its time (the sweep's input-bound line). A setting
/// only counts as keeping up when it also trains within this
/// share of the fastest setting measured: on a CPU the workers compete with
/// LibTorch's compute threads, and a short wait can come with a slower step
/// (measured here: 1 worker waited 2 % of the step but trained 5x slower).
constexpr double kLoaderThroughputTolerance = 0.10;
/// Each loader setting trains at least this many timed steps, and more
/// (up to `kLoaderMaxSteps`) to fill `kLoaderMinSeconds`: fewer steps
/// would mostly time the queue filling up.
constexpr int64_t kLoaderMinSteps = 5;
constexpr int64_t kLoaderMaxSteps = 50;
constexpr double kLoaderMinSeconds = 1.0;
/// Untimed steps first: the workers fill the prefetch queue.
constexpr int64_t kLoaderWarmupSteps = 2;

/// One loader setting, timed training at the chosen batch. JSON fields
/// (`to_json`): `workers`, `pin_memory`, `samples_per_s`, `data_wait_fraction`.
struct LoaderRow {
  int64_t workers = 0;
  bool pin_memory = false;
  double samples_per_s = 0;
  /// Share of the step spent waiting for the batch (0 to 1).
  double data_wait_fraction = 0;
};

/// The loader setting chosen, and why in one sentence.
struct LoaderChoice {
  int64_t workers = 0;
  bool pin_memory = false;
  std::string reason;
};

/// Worker counts to time: 0, 1, 2, 4, … below `cores`, and `cores` itself.
std::vector<int64_t> loader_worker_grid(int64_t cores);

/// The smallest worker count (at equal count, the faster pin setting) whose
/// data wait stays under `max_wait` and whose throughput is within
/// `kLoaderThroughputTolerance` of the fastest row; when none does, the
/// fastest row. Rows must not be empty.
LoaderChoice choose_loader(const std::vector<LoaderRow>& rows, double max_wait = kInputBoundWait);

/// Times every worker count of `grid` (with and without pinned memory when
/// `cuda`) through `measure` and returns the rows in that order. After the
/// first row, a setting is only timed while `out_of_time` (when given)
/// says false: the rows left out are the larger worker counts.
std::vector<LoaderRow> time_loaders(const std::function<LoaderRow(int64_t, bool)>& measure,
                                    const std::vector<int64_t>& grid, bool cuda,
                                    const std::function<bool()>& out_of_time = {});

/// Trains `runner`'s workload at `batch_size` on `data` through a `Loader`
/// with `workers` and `pin_memory` for `steps` timed steps (random batches
/// of `data`, seeded), and returns the row.
LoaderRow measure_loader(TrialRunner& runner, const Dataset& data, int64_t batch_size,
                         int64_t workers, bool pin_memory, int64_t prefetch, int64_t steps,
                         uint64_t seed);

/// Timed steps that fill `kLoaderMinSeconds` at `step_seconds` a step.
int64_t loader_steps(double step_seconds);

/// What `tune_loader` found: the rows, the choice, and a line saying how
/// they were measured (or why they were not).
struct LoaderTuning {
  std::vector<LoaderRow> rows;
  std::optional<LoaderChoice> choice;
  std::string note;
};

/// Loader tuning in `batchtune tune`: nothing (with a note saying why) for
/// synthetic data; else every worker count of `loader_worker_grid(cores)`,
/// pinned and not on CUDA, timed at `batch_size` for `loader_steps(step_seconds)`
/// steps, and `choose_loader`'s pick. `out_of_time` bounds the settings
/// timed after the first, as in `time_loaders`; the note says when it did.
LoaderTuning tune_loader(TrialRunner& runner, const Dataset& data, int64_t batch_size,
                         double step_seconds, int64_t prefetch, uint64_t seed, int64_t cores,
                         const std::function<bool()>& out_of_time = {});

/// The data wait of the chosen setting; nullopt without a choice.
std::optional<double> chosen_wait(const LoaderTuning& tuning);

/// The console table of a loader tuning.
std::string loader_table(const LoaderTuning& tuning);

/// Writes the choice into `plan` (workers, pin_memory, and the input
/// pipeline's reason).
void apply_loader_choice(Plan& plan, const LoaderChoice& choice);

/// Rewrites the plan's "input pipeline: ..." reason from its fields, with `why`.
void set_pipeline_reason(Plan& plan, const std::string& why);

/// Whether a run waited for data: "input-bound: ..." when the wait is at
/// least `max_wait` of the step (saying what to change), else "not
/// input-bound: ...". `loader_tuned`: the worker counts were already timed
/// (tune --data), so the advice is not to run that again.
std::string input_diagnosis(double data_wait_fraction, int64_t workers,
                            double max_wait = kInputBoundWait, bool loader_tuned = false);

nlohmann::json to_json(const LoaderRow& row);
nlohmann::json to_json(const std::vector<LoaderRow>& rows);

}  // namespace batchtune
