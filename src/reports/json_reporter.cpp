#include "batchtune/reports/json_reporter.h"

#include <cmath>

namespace batchtune {
namespace {

const char* failure_name(TrialFailure failure) {
  switch (failure) {
    case TrialFailure::kNone:
      return nullptr;
    case TrialFailure::kOutOfMemory:
      return "out_of_memory";
    case TrialFailure::kOverBudget:
      return "over_budget";
    case TrialFailure::kDoesNotRun:
      return "does_not_run";
  }
  return nullptr;
}

nlohmann::json string_or_null(const std::string& s) {
  return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s);
}

template <typename T>
nlohmann::json value_or_null(const std::optional<T>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

}  // namespace

nlohmann::json interval_json(const Estimate& estimate) {
  if (estimate.n == 0) return nullptr;
  return nlohmann::json::array({estimate.low, estimate.high});
}

nlohmann::json confidence_json(const std::optional<double>& confidence) {
  return confidence ? nlohmann::json(*confidence) : nlohmann::json("inconclusive");
}

nlohmann::json to_json(const Environment& env) {
  nlohmann::json gpus = nlohmann::json::array();
  for (const auto& gpu : env.gpus) {
    gpus.push_back({{"index", gpu.index},
                    {"name", gpu.name},
                    {"total_bytes", gpu.total_bytes},
                    {"free_bytes", gpu.free_bytes ? nlohmann::json(*gpu.free_bytes)
                                                  : nlohmann::json(nullptr)},
                    {"compute_capability",
                     std::to_string(gpu.compute_major) + "." + std::to_string(gpu.compute_minor)}});
  }
  return {
      {"torch_version", env.torch_version},
      {"torch_cuda", env.torch_cuda},
      {"cuda_available", env.cuda_available},
      {"cuda_reason", string_or_null(env.cuda_reason)},
      {"cuda_driver", string_or_null(env.cuda_driver)},
      {"device_count", env.gpus.size()},
      {"devices", gpus},
      {"nvml_available", env.nvml_available},
      {"nvml_reason", string_or_null(env.nvml_reason)},
      {"cpu_model", env.cpu_model},
      {"cpu_cores", env.cpu_cores},
      {"threads", env.threads},
      {"ram_total_bytes", env.ram_total_bytes},
      {"ram_available_bytes", env.ram_available_bytes},
  };
}

nlohmann::json to_json(const TrialResult& trial) {
  const char* failure = failure_name(trial.failure);
  return {
      {"batch_size", trial.batch_size},
      {"amp", amp_name(trial.amp)},
      {"fits", trial.fits},
      {"failure", failure != nullptr ? nlohmann::json(failure) : nlohmann::json(nullptr)},
      {"peak_bytes", trial.peak_bytes},
      {"capacity_bytes", trial.capacity_bytes},
      {"usable_bytes", trial.usable_bytes},
      {"margin", trial.margin},
      {"steps", trial.steps_run},
      {"step_ms", trial.step_ms},
      {"step_ms_spread", trial.step_ms_spread},
      {"step_ms_ci", interval_json(trial.step_ms_ci)},
      {"samples_per_s", trial.samples_per_s},
      {"samples_per_s_ci", interval_json(trial.samples_per_s_ci)},
      {"ci_level", trial.step_ms_ci.n > 0 ? nlohmann::json(trial.step_ms_ci.level)
                                          : nlohmann::json(nullptr)},
      {"warmup_steps", trial.warmup_steps_run},
      {"noisy", trial.noisy},
      {"noise_cause", string_or_null(trial.noise_cause)},
      {"tokens_per_s", trial.sequence_length > 0 ? nlohmann::json(trial.tokens_per_s)
                                                 : nlohmann::json(nullptr)},
      {"sequence_length", trial.sequence_length > 0 ? nlohmann::json(trial.sequence_length)
                                                    : nlohmann::json(nullptr)},
      {"busy", trial.busy},
      {"error", string_or_null(trial.error)},
  };
}

nlohmann::json to_json(const SearchResult& search) {
  nlohmann::json trials = nlohmann::json::array();
  for (const auto& t : search.trials) trials.push_back(to_json(t));
  nlohmann::json out = {
      {"max_batch_size", search.max_batch_size},
      {"search",
       {{"strategy", to_string(search.strategy)},
        {"trials", search.trials.size()},
        {"steps", search.steps},
        {"seconds", search.seconds},
        {"smallest_failure", search.smallest_failure ? nlohmann::json(*search.smallest_failure)
                                                     : nlohmann::json(nullptr)},
        {"hit_time_budget", search.hit_time_budget},
        {"hit_max_batch", search.hit_max_batch},
        {"confirmed", search.confirmed},
        {"lower_bound", search.lower_bound},
        {"stop_reason", search.stop_reason}}},
      {"trials", trials},
  };
  if (!search.trials.empty()) {
    out["margin"] = search.trials.front().margin;
    out["capacity_bytes"] = search.trials.front().capacity_bytes;
    out["usable_bytes"] = search.trials.front().usable_bytes;
  }
  return out;
}

nlohmann::json to_json(const Sample& sample, double start_s) {
  return {
      {"time_s", std::round((sample.time_s - start_s) * 1e3) / 1e3},  // ms: the clock's use
      {"device", sample.device},
      {"utilization_percent", value_or_null(sample.utilization_percent)},
      {"memory_used_bytes", value_or_null(sample.memory_used_bytes)},
      {"power_w", value_or_null(sample.power_watts)},
      {"energy_j", value_or_null(sample.energy_joules)},
  };
}

}  // namespace batchtune
