#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "batchtune/monitoring/environment.h"
#include "batchtune/tuning/search.h"
#include "batchtune/monitoring/sampler.h"
#include "batchtune/step/trial.h"

namespace batchtune {

/// `batchtune env` for people.
void print_environment(std::ostream& out, const Environment& env);

/// One trial for people: whether it fits, peak against the budget, speed.
void print_trial(std::ostream& out, const TrialResult& trial);

/// The table of a search's trials and its result.
void print_search(std::ostream& out, const SearchResult& search);

/// One progress line for a trial: `trial 3: batch 512 ... fits`.
std::string trial_progress_line(const TrialResult& trial, size_t index);
/// `batchtune monitor`'s heading, as `#` lines: what is sampled and how
/// often, why fields read n/a (`sampler.unavailable_reason()`, and
/// `gpu_reason` when no GPU is watched), then the column names.
void print_monitor_header(std::ostream& out, const Sampler& sampler, double interval_ms,
                          const std::string& gpu_reason);

/// One line per sample, like `nvidia-smi dmon`: seconds since `start_s`,
/// device, utilization %, memory, power W, energy J; `n/a` where unavailable.
void print_samples(std::ostream& out, const std::vector<Sample>& samples, double start_s);

}  // namespace batchtune
