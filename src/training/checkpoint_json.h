#pragma once

// The JSON of a checkpoint's record: the run's identity and the finished
// run's summary, as `write_checkpoint` stores them and `read_checkpoint`
// reads them back.

#include <nlohmann/json.hpp>

#include "batchtune/training/checkpoint.h"

namespace batchtune {

nlohmann::json to_json(const RunIdentity& identity);
/// Throws `nlohmann::json::exception` for a missing or mistyped field.
RunIdentity identity_from_json(const nlohmann::json& j);

/// The whole summary, so that a finished run's is re-emitted as it was.
nlohmann::json to_json_full(const TrainSummary& summary);
/// Throws `nlohmann::json::exception` for a missing or mistyped field.
TrainSummary summary_from_json(const nlohmann::json& j);

}  // namespace batchtune
