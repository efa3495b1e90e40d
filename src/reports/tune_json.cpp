#include "batchtune/reports/tune_json.h"

#include "batchtune/common/precision.h"
#include "batchtune/reports/json_reporter.h"

namespace batchtune {
namespace {

nlohmann::json optional_json(const std::optional<double>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

nlohmann::json tokens_json(const TokenBudgetResult& t) {
  nlohmann::json trials = nlohmann::json::array();
  for (const auto& trial : t.trials) trials.push_back(to_json(trial));
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& c : t.checks) {
    checks.push_back({{"batch_size", c.batch_size},
                      {"length", c.length},
                      {"predicted_bytes", c.predicted_bytes},
                      {"measured_bytes", c.measured_bytes},
                      {"fits", c.fits}});
  }
  nlohmann::json buckets = nlohmann::json::array();
  for (const auto& b : t.buckets) {
    buckets.push_back({{"max_length", b.max_length}, {"micro_batch_size", b.micro_batch_size}});
  }
  const MemoryModel& m = t.model;
  return {{"min_length", t.range.min},
          {"max_length", t.range.max},
          {"model",
           {{"fixed_bytes", m.fixed_bytes},
            {"per_token_bytes", m.per_token_bytes},
            {"per_token_length_bytes", m.per_token_length_bytes},
            {"quadratic", m.quadratic},
            {"fitted_quadratic_bytes", m.fitted_quadratic_bytes},
            {"fit_error", m.fit_error},
            {"linear_fit_error", m.linear_fit_error}}},
          {"trials", trials},
          {"checks", checks},
          {"token_budget", t.token_budget},
          {"length_buckets", buckets},
          {"reason", t.reason}};
}

}  // namespace

nlohmann::json to_json(const TuneResult& report) {
  nlohmann::json out = to_json(report.search);
  const auto finish = [&](nlohmann::json& j) {
    // What ran where, in both shapes (a --search-only run too).
    j["workload"] = report.workload;
    j["device"] = report.device;
    j["threads"] = report.threads;
    j["capacity_bytes"] = report.capacity_bytes;
    j["usable_bytes"] = report.usable_bytes;
    j["margin"] = report.margin;
    j["amp"] = amp_name(report.amp);
    j["amp_reason"] = report.amp_reason;
    j["amp_confidence"] = confidence_json(report.amp_confidence);
    j["time_budget_s"] = report.time_budget_s;
    j["budget_note"] = report.budget_note.empty() ? nlohmann::json(nullptr)
                                                  : nlohmann::json(report.budget_note);
    nlohmann::json phases = nlohmann::json::object();
    for (const auto& [phase, seconds] : report.phase_seconds) phases[to_string(phase)] = seconds;
    j["phase_seconds"] = phases;
    j["complete"] = report.complete;
    if (!report.complete) j["interrupted_by"] = report.interrupted_by;
    if (report.compile) {
      j["compile"] = {{"compile_seconds", report.compile->seconds},
                      {"graphs", report.compile->graphs},
                      {"recompiles", report.compile->recompiles},
                      {"note", report.compile->note}};
    } else {
      j["compile"] = nullptr;
    }
  };
  if (report.search_only) {
    finish(out);
    return out;
  }
  if (report.eval_search) {
    // The forward-only search: its answer, how it stopped, and its trials.
    nlohmann::json eval = to_json(*report.eval_search);
    out["eval_search"] = {{"max_batch_size", eval["max_batch_size"]},
                          {"search", eval["search"]},
                          {"trials", eval["trials"]}};
  } else {
    out["eval_search"] = nullptr;
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : report.sweep) {
    rows.push_back({{"batch_size", r.batch_size},
                    {"amp", amp_name(r.amp)},
                    {"samples_per_s", r.samples_per_s},
                    {"samples_per_s_spread", r.samples_per_s_spread},
                    {"samples_per_s_ci", interval_json(r.samples_per_s_ci)},
                    {"step_ms_ci", interval_json(r.step_ms_ci)},
                    {"ci_level", r.samples_per_s_ci.n > 0 ? nlohmann::json(r.samples_per_s_ci.level)
                                                          : nlohmann::json(nullptr)},
                    {"noisy", r.noisy},
                    {"noise_cause", r.noise_cause.empty() ? nlohmann::json(nullptr)
                                                          : nlohmann::json(r.noise_cause)},
                    {"tokens_per_s", r.tokens_per_s > 0 ? nlohmann::json(r.tokens_per_s)
                                                        : nlohmann::json(nullptr)},
                    {"step_ms", r.step_ms},
                    {"busy", r.busy},
                    {"utilization", optional_json(r.utilization)},
                    {"peak_bytes", r.peak_bytes},
                    {"energy_j_per_sample", optional_json(r.energy_j_per_sample)},
                    {"flops_per_s", optional_json(r.flops_per_s)},
                    {"mfu", optional_json(r.mfu)},
                    {"steps", r.steps}});
  }
  out["sweep"] = rows;
  if (report.peak_flops) {
    out["peak_flops"] = {{"flops_per_s", report.peak_flops->flops_per_s},
                         {"gpu", report.peak_flops->gpu},
                         {"precision", report.peak_flops->precision},
                         {"source", report.peak_flops->source}};
  } else {
    out["peak_flops"] = nullptr;
  }
  out["mfu_note"] = report.mfu_note.empty() ? nlohmann::json(nullptr)
                                            : nlohmann::json(report.mfu_note);
  if (report.tokens) out["tokens"] = tokens_json(*report.tokens);
  out["objective"] = to_string(report.objective);
  out["chosen_batch_size"] = report.selection.batch_size > 0
                                 ? nlohmann::json(report.selection.batch_size)
                                 : nlohmann::json(nullptr);
  out["reason"] = report.selection.reason;
  out["selection"] = {{"batch_size", report.selection.batch_size > 0
                                         ? nlohmann::json(report.selection.batch_size)
                                         : nlohmann::json(nullptr)},
                      {"confidence", confidence_json(report.selection.confidence)},
                      {"contenders", report.selection.contenders},
                      {"reason", report.selection.reason}};
  out["diagnosis"] = {{"kind", report.diagnosis.kind}, {"text", report.diagnosis.text}};
  out["utilization_note"] =
      report.utilization_note.empty() ? nlohmann::json(nullptr) : nlohmann::json(report.utilization_note);
  out["utilization_details"] = report.utilization_details.empty()
                                   ? nlohmann::json(nullptr)
                                   : nlohmann::json(report.utilization_details);
  out["energy_note"] = report.energy_note.empty() ? nlohmann::json(nullptr)
                                                  : nlohmann::json(report.energy_note);
  out["noise_scale"] = report.noise ? optional_json(report.noise->noise_scale) : nlohmann::json();
  if (report.noise) {
    const NoiseScaleMeasurement& n = *report.noise;
    out["noise_scale_run"] = {{"data", report.noise_data},
                              {"small_batch", n.small_batch},
                              {"big_batch", n.big_batch},
                              {"micro_batches_tried", n.micro_batches_tried},
                              {"steps", n.steps},
                              {"measurements", n.measurements},
                              {"seconds", n.seconds},
                              {"gradient_sq_norm", optional_json(n.gradient_sq_norm)},
                              {"trace_covariance", optional_json(n.trace_covariance)},
                              {"note", n.note.empty() ? nlohmann::json() : nlohmann::json(n.note)}};
  }
  nlohmann::json goodput = nlohmann::json::array();
  for (const auto& c : report.goodput) {
    goodput.push_back({{"global_batch_size", c.global_batch_size},
                       {"micro_batch_size", c.micro_batch_size},
                       {"accumulation_steps", c.accumulation_steps},
                       {"samples_per_s", c.samples_per_s},
                       {"efficiency", c.efficiency},
                       {"goodput", c.goodput}});
  }
  out["goodput"] = goodput;
  if (report.goodput_base_batch > 0) out["goodput_base_batch"] = report.goodput_base_batch;
  if (report.goodput_choice) {
    out["goodput_global_batch_size"] = report.goodput_choice->global_batch_size;
  }
  if (report.objective == Objective::kEnergy) {
    out["eta"] = report.eta;
    nlohmann::json costs = nlohmann::json::array();
    for (const auto& c : report.energy_costs) {
      costs.push_back({{"batch_size", c.batch_size},
                       {"joules_per_sample", c.joules_per_sample},
                       {"seconds_per_sample", c.seconds_per_sample},
                       {"watts", c.watts},
                       {"cost", c.cost}});
    }
    out["energy_cost"] = costs;
  }
  if (report.plan) out["plan"] = to_json(*report.plan);
  out["loader"] = to_json(report.loader.rows);
  out["loader_note"] = report.loader.note;
  finish(out);
  return out;
}

}  // namespace batchtune
