#include "batchtune/tuning/tune_options.h"

#include <fmt/format.h>

#include <algorithm>

#include "batchtune/common/option.h"
#include "batchtune/data/dataset.h"
#include "batchtune/monitoring/monitor.h"
#include "batchtune/monitoring/sampler.h"
#include "tune_objectives.h"

namespace batchtune {

ResolvedTuneOptions resolve(const TuneOptions& options) {
  const SearchOptions& search = options.search();
  if (search.max_batch() < 1) {
    throw OptionError(Option::kMaxBatch, fmt::format("must be at least 1, got {}", search.max_batch()));
  }
  if (search.max_batch() > kMaxPlanCount) {
    throw OptionError(Option::kMaxBatch, fmt::format("must be at most {}, got {}", kMaxPlanCount,
                                                     search.max_batch()));
  }
  if (!(search.tolerance() >= 0 && search.tolerance() < 1)) {
    throw OptionError(Option::kSearchTolerance,
                      fmt::format("must be at least 0 and below 1, got {}", search.tolerance()));
  }
  check_margin(options.margin());
  if (!(options.time_budget_s() >= kMinTimeBudgetSeconds)) {
    throw OptionError(Option::kTimeBudget,
                      fmt::format("must be at least {:.0f} s, got {}; a tune needs time for its "
                                  "precision, search and sweep",
                                  kMinTimeBudgetSeconds, options.time_budget_s()));
  }
  if (!(options.tolerance() >= 0 && options.tolerance() < 1)) {
    throw OptionError(Option::kTolerance,
                      fmt::format("must be at least 0 and below 1, got {}", options.tolerance()));
  }
  if (!(options.eta() >= 0 && options.eta() <= 1)) {
    throw OptionError(Option::kEta,
                      fmt::format("must be between 0 (time only) and 1 (energy only), got {}",
                                  options.eta()));
  }
  if (options.noise_steps() < 1 || options.noise_steps() > kMaxNoiseRunSteps) {
    throw OptionError(Option::kNoiseSteps, fmt::format("must be from 1 to {}, got {}",
                                                       kMaxNoiseRunSteps, options.noise_steps()));
  }
  if (options.objective() == Objective::kGoodput && options.plan().target_batch) {
    throw OptionError(Option::kTargetBatch,
                      fmt::format("{0} goodput chooses the global batch itself; leave {1} out, or "
                                  "use {0} throughput with it",
                                  mention(Option::kObjective), mention(Option::kTargetBatch)));
  }
  validate(options.plan());
  if (options.monitor() != nullptr) {
    check_energy_readable(options.objective(), options.monitor()->sampler().unavailable_reason());
  }
  // One precision field: the plan request's, where it says one, is the tune's.
  TuneOptions resolved = options;
  PlanRequest plan = options.plan();
  if (plan.amp) resolved.amp(*plan.amp);
  plan.amp.reset();
  // One front end: the search's stop reason and the plan's reasons name
  // options as the tune's caller does.
  plan.front_end = options.front_end();
  resolved.plan(plan);
  SearchOptions search_options = options.search();
  search_options.front_end(options.front_end());
  resolved.search(search_options);
  return ResolvedTuneOptions(std::move(resolved));
}

void validate(const TuneOptions& options) { resolve(options); }

ResolvedTuneOptions& ResolvedTuneOptions::stop(StopRequest value) {
  options_.stop(std::move(value));
  return *this;
}

ResolvedTuneOptions& ResolvedTuneOptions::data_parallel(DataParallel* value) {
  options_.data_parallel(value);
  return *this;
}

ResolvedTuneOptions& ResolvedTuneOptions::data(const Dataset* value) {
  options_.data(value);
  return *this;
}

ResolvedTuneOptions& ResolvedTuneOptions::monitor(Monitor* value) {
  if (value != nullptr) {
    check_energy_readable(options_.objective(), value->sampler().unavailable_reason());
  }
  options_.monitor(value);
  return *this;
}

ResolvedTuneOptions& ResolvedTuneOptions::clock(Clock* value) {
  options_.clock(value);
  return *this;
}

Objective auto_objective(bool real_data, const PlanRequest& request) {
  return real_data && !request.target_batch ? Objective::kGoodput : Objective::kThroughput;
}

TuneOptions quick_tune_options(const PlanRequest& request, int64_t max_batch,
                               const Dataset* data) {
  const bool real_data = data != nullptr && !data->synthetic();
  return TuneOptions()
      .search(SearchOptions().max_batch(std::min(max_batch, kDefaultMaxBatch)))
      .time_budget_s(kQuickTuneTimeBudgetSeconds)
      .objective(auto_objective(real_data, request))
      .data(real_data ? data : nullptr)
      .amp(request.amp.value_or(AmpMode::kAuto))
      .plan(request)
      .front_end(request.front_end);
}

}  // namespace batchtune
