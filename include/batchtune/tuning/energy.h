#pragma once

#include <optional>
#include <string>
#include <vector>

#include "batchtune/monitoring/monitor.h"
#include "batchtune/tuning/sweep.h"

namespace batchtune {

/// Default weight of energy against time in the Zeus cost (NSDI 2023):
/// halfway between the least energy and the shortest time.
constexpr double kDefaultEta = 0.5;

/// Reads `monitor`'s summary of `device` over the trial's timed steps alone
/// (`TrialResult::timed_from_s` to `timed_to_s`, moved onto the monitor's
/// clock by `clock_offset_s`, its time less the runner's) into the trial's
/// `utilization` and `energy_joules`: the snapshot, the batch building, the
/// warm-up and the restore around them are no part of a row's GPU-Util.
/// Leaves both empty where no step was timed or no sample fell in the window.
void attach_readings(const Monitor& monitor, const std::string& device, double clock_offset_s,
                     TrialResult& trial);

/// Device energy of a trial's timed steps from the monitor's summary of the
/// trial's window (`window_s` seconds, warm-up included; `timed_s` of it
/// timed): the energy counter's growth, the timed share of it; where there
/// is no counter, mean power × timed time; nullopt where neither was read.
std::optional<double> trial_energy_joules(const SampleSummary& summary, double timed_s,
                                          double window_s);

/// One sweep row's Zeus cost per sample: η·energy + (1−η)·max_power·time.
struct EnergyCost {
  int64_t batch_size = 0;
  double joules_per_sample = 0;
  double seconds_per_sample = 0;  ///< 1 / samples_per_s
  double watts = 0;               ///< mean power of the row: J/sample × samples/s
  double cost = 0;                ///< in joules per sample
};

/// The cost of every row with an energy reading. `max_power_w` is the
/// highest mean power measured over those rows: Zeus takes the device's power
/// limit, which is not readable on every device (a CPU's RAPL has none); the
/// highest power drawn is the price of a second that the runs themselves set.
/// Throws `batchtune::Error` naming `--eta` when η is outside [0, 1].
std::vector<EnergyCost> energy_costs(const std::vector<SweepRow>& rows, double eta);

/// `--objective energy`: the row of the lowest cost per sample, and why.
/// Throws `batchtune::Error` when no row has an energy reading, saying
/// `unavailable_reason` (why the counter is missing).
Selection select_energy(const std::vector<SweepRow>& rows, double eta,
                        const std::string& unavailable_reason);

/// "energy per sample unavailable, because …": the sampler's reason (its
/// `energy` part where it names fields), or that no trial got a reading.
std::string energy_unavailable_note(const std::string& sampler_reason);

}  // namespace batchtune
