#pragma once

#include <nlohmann/json.hpp>

#include "batchtune/monitoring/environment.h"
#include "batchtune/tuning/search.h"
#include "batchtune/monitoring/sampler.h"
#include "batchtune/step/trial.h"

namespace batchtune {

/// JSON of `batchtune env --json`. Field names are stable (see README).
nlohmann::json to_json(const Environment& env);

/// An interval as `[low, high]`, null for an estimate of no readings.
nlohmann::json interval_json(const Estimate& estimate);
/// A decision's confidence: the level reached, or "inconclusive".
nlohmann::json confidence_json(const std::optional<double>& confidence);

/// JSON of one trial, as `batchtune probe --json` writes it: `batch_size`,
/// `fits`, `peak_bytes`, `capacity_bytes`, `usable_bytes`, `margin`,
/// `step_ms`, `samples_per_s`, `error` (null when it fits) and more.
nlohmann::json to_json(const TrialResult& trial);

/// JSON of a search, as `batchtune tune --search-only --json` writes it:
/// `max_batch_size`, `search` {`strategy`, `trials`, `steps`, `seconds`, ...}
/// and `trials` (probe-shaped objects).
nlohmann::json to_json(const SearchResult& search);
/// JSON of one sample, as each line of `batchtune monitor --json` after the
/// first: `time_s` (seconds since `start_s`), `device`,
/// `utilization_percent`, `memory_used_bytes`, `power_w`, `energy_j`; a field
/// the sampler cannot read is null.
nlohmann::json to_json(const Sample& sample, double start_s = 0);

}  // namespace batchtune
