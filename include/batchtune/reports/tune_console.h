#pragma once

#include <ostream>

#include "batchtune/tuning/tune.h"

namespace batchtune {

/// The sweep as a console table, the chosen row marked, then the reason and
/// the diagnosis.
void print_sweep(std::ostream& out, const TuneResult& report);
/// The length phase: its trials (batch, length, peak), the memory model, its
/// checks and the token budget with its buckets.
void print_lengths(std::ostream& out, const TokenBudgetResult& tokens);

/// The goodput candidates as a console table, the chosen one marked.
void print_goodput(std::ostream& out, const TuneResult& report);

}  // namespace batchtune
