#include "tune_objectives.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "batchtune/common/error.h"
#include "batchtune/tuning/goodput.h"
#include "batchtune/common/shape.h"

namespace batchtune::cli {

void add_objective_flags(CLI::App& app, ObjectiveFlags& flags) {
  app.add_option("--eta", flags.eta,
                 "energy objective: weight of energy against time in the cost (0..1)")
      ->capture_default_str();
  app.add_option("--noise-steps", flags.noise_steps,
                 "goodput objective: optimizer steps of the noise-scale run")
      ->capture_default_str();
}

void check_objective_flags(const ObjectiveFlags& flags, Objective objective, const CLI::App& app) {
  if (!(flags.eta >= 0 && flags.eta <= 1)) {
    throw Error(fmt::format("--eta: must be between 0 (time only) and 1 (energy only), got {}",
                            flags.eta));
  }
  if (app.count("--eta") > 0 && objective != Objective::kEnergy) {
    throw Error("--eta: weighs the energy objective; add --objective energy");
  }
  if (flags.noise_steps < 1) {
    throw Error(fmt::format("--noise-steps: must be at least 1, got {}", flags.noise_steps));
  }
  if (objective == Objective::kGoodput && app.count("--target-batch") > 0) {
    throw Error("--target-batch: --objective goodput chooses the global batch itself; leave "
                "--target-batch out, or use --objective throughput with it");
  }
}

void check_energy_readable(Objective objective, const std::string& sampler_reason) {
  if (objective != Objective::kEnergy) return;
  if (sampler_reason.find("energy") != std::string::npos &&
      sampler_reason.find("power") != std::string::npos) {
    throw Error(fmt::format("--objective energy: {}; use --objective throughput or goodput here",
                            energy_unavailable_note(sampler_reason)));
  }
}

void apply_energy(TuneReport& report, const ObjectiveFlags& flags,
                  const std::string& sampler_reason) {
  report.eta = flags.eta;
  const bool all = !report.sweep.empty() &&
                   std::all_of(report.sweep.begin(), report.sweep.end(),
                               [](const SweepRow& r) { return r.energy_j_per_sample.has_value(); });
  report.energy_note = all ? std::string() : energy_unavailable_note(sampler_reason);
  if (report.objective == Objective::kEnergy && !report.sweep.empty()) {
    report.energy_costs = energy_costs(report.sweep, flags.eta);
    report.selection = select_energy(report.sweep, flags.eta, sampler_reason);
  }
}

PlanFlags apply_goodput(TuneReport& report, const ObjectiveFlags& flags, const PlanFlags& plan,
                        const CLI::App& app, Workload& workload, DeviceMemory& memory,
                        const Dataset& data, std::ostream& out) {
  int64_t largest = 0;
  for (const auto& row : report.sweep) largest = std::max(largest, row.batch_size);
  const int64_t micro =
      std::min(std::max(report.selection.batch_size, std::min(kNoiseRunMinMicroBatch, largest)),
               kNoiseRunMaxMicroBatch);
  fmt::print(out, "\nnoise scale: training {} steps of micro-batch {} x {} on {}\n",
             flags.noise_steps, micro, kNoiseRunAccumulation, data.describe());
  const double lr = app.count("--base-lr") > 0 ? plan.base_lr : workload.options().lr();
  NoiseScaleMeasurement noise =
      measure_noise_scale(workload, memory, data, micro, lr, flags.noise_steps,
                          workload.options().seed());
  report.noise = noise;
  report.noise_data = data.describe();
  int64_t smallest = report.sweep.front().batch_size;
  for (const auto& row : report.sweep) smallest = std::min(smallest, row.batch_size);
  report.goodput_base_batch = app.count("--base-batch") > 0 ? plan.base_batch : smallest;
  if (noise.noise_scale) {
    fmt::print(out,
               "noise scale {:.1f} (|G|^2 {:.4g}, tr(Sigma) {:.4g}; {} measurements of batch {} "
               "against {}, {:.1f} s)\n",
               *noise.noise_scale, noise.gradient_sq_norm.value_or(0),
               noise.trace_covariance.value_or(0), noise.measurements, noise.small_batch,
               noise.big_batch, noise.seconds);
  } else {
    fmt::print(out, "noise scale not measured: {}\n", noise.note);
  }
  // Unbounded noise makes every batch equally efficient: goodput is throughput.
  const double noise_scale = noise.noise_scale.value_or(std::numeric_limits<double>::infinity());
  report.goodput = goodput_candidates(report.sweep, noise_scale, report.goodput_base_batch,
                                      data.size());
  const GoodputChoice choice = select_goodput(report.goodput, noise_scale, report.goodput_base_batch);
  report.goodput_choice = choice.chosen;
  report.selection = {choice.chosen.micro_batch_size,
                      noise.noise_scale
                          ? choice.reason
                          : "goodput: noise scale unbounded (" + noise.note +
                                "), so every batch is equally efficient; " + choice.reason};
  print_goodput(out, report);
  PlanFlags out_flags = plan;
  out_flags.target_batch = choice.chosen.global_batch_size;
  return out_flags;
}

void explain_goodput_plan(Plan& plan) {
  for (auto& reason : plan.reasons) {
    if (reason.rfind("global batch ", 0) != 0) continue;
    reason = plan.accumulation_steps == 1
                 ? fmt::format("global batch {}: the goodput choice, the micro-batch itself",
                               plan.global_batch_size)
                 : fmt::format("global batch {}: the goodput choice, {} accumulated micro-batches "
                               "of {}",
                               plan.global_batch_size, plan.accumulation_steps,
                               plan.micro_batch_size);
  }
}

}  // namespace batchtune::cli
