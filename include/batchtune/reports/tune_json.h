#pragma once

#include <nlohmann/json.hpp>

#include "batchtune/tuning/tune.h"

namespace batchtune {

/// The JSON of `batchtune tune --json`: the search's fields (`max_batch_size`,
/// `search`, `trials`) and `sweep`, `chosen_batch_size`, `objective`,
/// `diagnosis`, `complete`, `energy_note`; with `--objective goodput`
/// `noise_scale`, `noise_scale_run` and `goodput`; with `energy`, `eta` and
/// `energy_cost`.
nlohmann::json to_json(const TuneResult& report);

}  // namespace batchtune
