#pragma once

// The JSON of a checkpoint's record: the run's identity, as
// `write_checkpoint` stores it and `read_checkpoint` reads it back (the
// finished run's summary is stored as its report is written:
// training/train_summary_json.h).

#include <nlohmann/json.hpp>

#include "batchtune/training/checkpoint.h"

namespace batchtune {

nlohmann::json to_json(const RunIdentity& identity);
/// Throws `nlohmann::json::exception` for a missing or mistyped field.
RunIdentity identity_from_json(const nlohmann::json& j);

}  // namespace batchtune
