#pragma once

#include <ostream>

#include "batchtune/environment.h"
#include "batchtune/search.h"
#include "batchtune/trial.h"

namespace batchtune {

/// `batchtune env` for people.
void print_environment(std::ostream& out, const Environment& env);

/// One trial for people: whether it fits, peak against the budget, speed.
void print_trial(std::ostream& out, const TrialResult& trial);

/// The table of a search's trials and its result.
void print_search(std::ostream& out, const SearchResult& search);

/// One progress line for a trial: `trial 3: batch 512 ... fits`.
std::string trial_progress_line(const TrialResult& trial, size_t index);

}  // namespace batchtune
