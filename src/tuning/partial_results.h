#pragma once

#include <string>
#include <vector>

#include "batchtune/tuning/tune_result.h"

namespace batchtune {

/// What an interrupted tune keeps: the trials it finished, the largest that
/// fitted as the answer, and a sweep row per batch size timed so far.
void keep_partial_results(TuneResult& result, const std::vector<TrialResult>& searched,
                          const std::vector<TrialResult>& swept, SearchStrategy strategy,
                          const std::string& why);

}  // namespace batchtune
