#pragma once

#include <ostream>

#include "batchtune/environment.h"
#include "batchtune/trial.h"

namespace batchtune {

/// `batchtune env` for people.
void print_environment(std::ostream& out, const Environment& env);

/// One trial for people: whether it fits, peak against the budget, speed.
void print_trial(std::ostream& out, const TrialResult& trial);

}  // namespace batchtune
