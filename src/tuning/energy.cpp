#include "batchtune/tuning/energy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"

namespace batchtune {

void attach_readings(const Monitor& monitor, const std::string& device, double clock_offset_s,
                     TrialResult& trial) {
  if (!(trial.timed_to_s > trial.timed_from_s)) return;
  const double from = trial.timed_from_s + clock_offset_s;
  const double to = trial.timed_to_s + clock_offset_s;
  for (const auto& s : monitor.summarize(from, to)) {
    if (s.device != device) continue;
    trial.utilization = s.mean_utilization_percent;
    double timed = 0;
    for (double seconds : trial.step_seconds) timed += seconds;
    trial.energy_joules = trial_energy_joules(s, timed, to - from);
  }
}

std::optional<double> trial_energy_joules(const SampleSummary& summary, double timed_s,
                                          double window_s) {
  if (!(timed_s > 0)) return std::nullopt;
  if (summary.energy_joules && window_s > 0) {
    // The counter covers warm-up too: keep the timed steps' share.
    return *summary.energy_joules * std::min(1.0, timed_s / window_s);
  }
  if (summary.mean_power_watts) return *summary.mean_power_watts * timed_s;
  return std::nullopt;
}

std::vector<EnergyCost> energy_costs(const std::vector<SweepRow>& rows, double eta) {
  if (!(eta >= 0 && eta <= 1)) {
    throw OptionError(Option::kEta,
                      fmt::format("must be between 0 (time only) and 1 (energy only), got {}", eta));
  }
  std::vector<EnergyCost> costs;
  double max_power = 0;
  for (const auto& row : rows) {
    if (!row.energy_j_per_sample || !(row.samples_per_s > 0)) continue;
    EnergyCost c;
    c.batch_size = row.batch_size;
    c.joules_per_sample = *row.energy_j_per_sample;
    c.seconds_per_sample = 1 / row.samples_per_s;
    c.watts = c.joules_per_sample * row.samples_per_s;
    max_power = std::max(max_power, c.watts);
    costs.push_back(c);
  }
  for (auto& c : costs) {
    c.cost = eta * c.joules_per_sample + (1 - eta) * max_power * c.seconds_per_sample;
  }
  return costs;
}

Selection select_energy(const std::vector<SweepRow>& rows, double eta,
                        const std::string& unavailable_reason) {
  const std::vector<EnergyCost> costs = energy_costs(rows, eta);
  if (costs.empty()) {
    throw OptionError(Option::kObjective,
                      fmt::format("energy: no sweep row has an energy reading ({}); use {} "
                                  "throughput or goodput here",
                                  energy_unavailable_note(unavailable_reason),
                                  mention(Option::kObjective)));
  }
  const EnergyCost* best = &costs.front();
  const EnergyCost* least_energy = &costs.front();
  double max_power = 0;
  for (const auto& c : costs) {
    if (c.cost < best->cost) best = &c;
    if (c.joules_per_sample < least_energy->joules_per_sample) least_energy = &c;
    max_power = std::max(max_power, c.watts);
  }
  std::string reason = fmt::format(
      "energy: {} has the lowest cost per sample, {:.4g} J = {:.2f} x {:.4g} J + {:.2f} x {:.1f} W "
      "(the highest power measured) x {:.4g} s",
      best->batch_size, best->cost, eta, best->joules_per_sample, 1 - eta, max_power,
      best->seconds_per_sample);
  if (least_energy->batch_size != best->batch_size) {
    reason += fmt::format("; {} uses the least energy ({:.4g} J/sample) but takes {:.1f}x as long",
                          least_energy->batch_size, least_energy->joules_per_sample,
                          least_energy->seconds_per_sample / best->seconds_per_sample);
  }
  // The confidence is the caller's to set (rows_confidence); energy names no contenders.
  return {best->batch_size, reason, std::nullopt, {}};
}

std::string energy_unavailable_note(const std::string& sampler_reason) {
  std::string why = sampler_reason;
  // A sampler names fields: "energy, power: <why>; utilization: <why>".
  const auto at = why.find("energy");
  if (at != std::string::npos) {
    const auto colon = why.find(": ", at);
    const auto end = why.find("; ", at);
    if (colon != std::string::npos && (end == std::string::npos || colon < end)) {
      why = why.substr(colon + 2, end == std::string::npos ? std::string::npos : end - colon - 2);
    }
  } else {
    why = "the monitor took no energy or power readings during the trials";
  }
  return "energy per sample unavailable, because " + (why.empty() ? "no counter was read" : why);
}

}  // namespace batchtune
