#pragma once

#include <cstdint>
#include <string>

#include "batchtune/tuning/tune_options.h"
#include "batchtune/tuning/tune_result.h"
#include "batchtune/tuning/tune_subject.h"

namespace batchtune {

class Dataset;
class DeviceMemory;

/// Refuses the energy objective where the sampler reads neither energy nor
/// power (`sampler_reason`: what it cannot read).
void check_energy_readable(Objective objective, const std::string& sampler_reason);

/// The energy note, and for `energy` the selection by Zeus cost.
void apply_energy(TuneResult& result, double eta, const std::string& sampler_reason);

/// For `goodput`: the noise scale measured by `subject` on `data` near the
/// throughput choice within `seconds`, the candidates and the choice;
/// returns the global batch to plan.
int64_t apply_goodput(TuneResult& result, const TuneOptions& options, TuneSubject& subject,
                      DeviceMemory& memory, const Dataset& data, double seconds);

}  // namespace batchtune
