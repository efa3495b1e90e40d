#pragma once

#include <string>

#include "batchtune/tuning/tune.h"

namespace batchtune {

/// One self-contained HTML page (inline SVG, no scripts) to send a
/// colleague: the verdict (or that the run was interrupted), the plan,
/// throughput with its spread as error bars, memory against the capacity and
/// the usable limit with the failed trials, GFLOP/s, utilization over the
/// run with the batch that ran shaded, the sweep and search-trial tables, and
/// the command line, batchtune's version and the date.
std::string html_report(const TuneResult& report);

}  // namespace batchtune
