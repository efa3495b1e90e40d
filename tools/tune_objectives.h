#pragma once

// What `tune` does beyond throughput: `--objective goodput` (a short training
// run measures the gradient noise scale, then goodput per global batch) and
// `--objective energy` (the Zeus cost per sample), and the data they train on.

#include <CLI/CLI.hpp>

#include <cstdint>
#include <ostream>
#include <string>

#include "batchtune/data/dataset.h"
#include "batchtune/monitoring/energy.h"
#include "batchtune/training/noise_scale.h"
#include "batchtune/reports/tune_report.h"
#include "plan_flags.h"
#include "workload_flags.h"

namespace batchtune::cli {

/// The measuring run's micro-batch at most: the noise scale does not depend
/// on the batch sizes it is measured at, only its spread does, and a short
/// run at a large micro-batch would take minutes on a CPU.
constexpr int64_t kNoiseRunMaxMicroBatch = 64;
/// ... and at least this, where it fits: at micro-batches of 1 or 2 a run of
/// a few dozen steps often left the smoothed |G|² estimate negative
/// (Fashion-MNIST, mlp, 20 steps of 2 x 4), so no noise scale at all.
constexpr int64_t kNoiseRunMinMicroBatch = 8;

struct ObjectiveFlags {
  double eta = kDefaultEta;
  int64_t noise_steps = kDefaultNoiseRunSteps;
};

void add_objective_flags(CLI::App& app, ObjectiveFlags& flags);

/// Checks the flags against the objective; throws `batchtune::Error`.
void check_objective_flags(const ObjectiveFlags& flags, Objective objective, const CLI::App& app);

/// Before the search, for `energy`: throws `batchtune::Error` saying why when
/// the sampler can read neither an energy counter nor power
/// (`sampler_reason` names both fields), rather than after the whole sweep.
void check_energy_readable(Objective objective, const std::string& sampler_reason);

/// After the sweep: for `energy`, the selection by Zeus cost; the energy note
/// either way. `sampler_reason` is the monitor's `unavailable_reason()`.
void apply_energy(TuneReport& report, const ObjectiveFlags& flags,
                  const std::string& sampler_reason);

/// After the sweep, for `goodput`: measures the noise scale on `data` at the
/// throughput choice's micro-batch, fills the report's goodput candidates and
/// selection (the chosen candidate's micro-batch, with the reason), prints
/// them, and returns the plan flags that make its global batch.
PlanFlags apply_goodput(TuneReport& report, const ObjectiveFlags& flags, const PlanFlags& plan,
                        const CLI::App& app, Workload& workload, DeviceMemory& memory,
                        const Dataset& data, std::ostream& out);

/// The plan's global-batch reason for a goodput choice (the plan's own
/// reason speaks of a `--target-batch` the user did not give).
void explain_goodput_plan(Plan& plan);

}  // namespace batchtune::cli
