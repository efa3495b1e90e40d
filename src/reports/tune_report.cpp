#include "batchtune/reports/tune_report.h"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <ctime>

#include "batchtune/reports/console_reporter.h"
#include "batchtune/reports/json_reporter.h"
#include "batchtune/reports/train_reporter.h"
#include "batchtune/common/error.h"
#include "batchtune/step/amp.h"
#include "batchtune/common/size.h"
#include "reports/svg_chart.h"

namespace batchtune {
namespace {

nlohmann::json optional_json(const std::optional<double>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

std::string html_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
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

std::string tokens_html(const TokenBudgetResult& t) {
  std::string rows;
  for (const auto& trial : t.trials) {
    rows += fmt::format("<tr class='{}'><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                        trial.fits ? "fit" : "failed", trial.batch_size, trial.sequence_length,
                        trial.fits ? "fits" : "does not fit", format_bytes(trial.peak_bytes));
  }
  std::string buckets;
  for (const auto& b : t.buckets) {
    buckets += fmt::format("<tr><td>{}</td><td>{}</td></tr>", b.max_length, b.micro_batch_size);
  }
  return fmt::format(
      "<h2>Lengths {}..{}: token budget {}</h2>\n<p>{}</p>\n<table><tr><th>batch</th>"
      "<th>length</th><th>outcome</th><th>peak memory</th></tr>\n{}</table>\n<table><tr>"
      "<th>bucket (tokens)</th><th>micro-batch</th></tr>{}</table>\n",
      t.range.min, t.range.max, t.token_budget, html_escape(t.reason), rows, buckets);
}

}  // namespace

void print_lengths(std::ostream& out, const TokenBudgetResult& t) {
  fmt::print(out, "  {:>8}  {:>8}  {:>6}  {:>22}\n", "batch", "length", "fits", "peak");
  for (const auto& trial : t.trials) {
    fmt::print(out, "  {:>8}  {:>8}  {:>6}  {:>22}\n", trial.batch_size, trial.sequence_length,
               trial.fits ? "yes" : "no", format_bytes(trial.peak_bytes));
  }
  const MemoryModel& m = t.model;
  fmt::print(out, "memory model: peak = {} + {:.1f} B x batch x length{} (worst error {:.1f} %; "
                  "linear {:.1f} %, fitted quadratic term {:.3g} B){}\n",
             format_bytes(static_cast<int64_t>(m.fixed_bytes)), m.per_token_bytes,
             m.quadratic ? fmt::format(" + {:.3g} B x batch x length^2", m.per_token_length_bytes)
                         : "",
             100 * m.fit_error, 100 * m.linear_fit_error, m.fitted_quadratic_bytes,
             m.quadratic ? "" : ": linear in tokens");
  for (const auto& c : t.checks) {
    fmt::print(out, "check at {} x {}: predicted {}, measured {} ({})\n", c.batch_size, c.length,
               format_bytes(static_cast<int64_t>(c.predicted_bytes)),
               format_bytes(c.measured_bytes), c.fits ? "fits" : "does not fit");
  }
  std::string buckets;
  for (const auto& b : t.buckets) {
    buckets += fmt::format("{}{} x {}", buckets.empty() ? "" : ", ", b.micro_batch_size, b.max_length);
  }
  fmt::print(out, "token budget {} tokens per micro-batch; buckets (samples x tokens): {}\n",
             t.token_budget, buckets);
}

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
                    {"steps", r.steps}});
  }
  out["sweep"] = rows;
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

void print_goodput(std::ostream& out, const TuneResult& report) {
  fmt::print(out, "\n  {:>8}  {:>8}  {:>6}  {:>12}  {:>10}  {:>12}\n", "global", "micro", "accum",
             "samples/s", "efficiency", "goodput");
  for (const auto& c : report.goodput) {
    const bool chosen =
        report.goodput_choice && c.global_batch_size == report.goodput_choice->global_batch_size;
    fmt::print(out, "{} {:>8}  {:>8}  {:>6}  {:>12.1f}  {:>10.3f}  {:>12.1f}\n",
               chosen ? ">" : " ", c.global_batch_size, c.micro_batch_size, c.accumulation_steps,
               c.samples_per_s, c.efficiency, c.goodput);
  }
  if (!report.selection.reason.empty()) fmt::print(out, "{}\n", report.selection.reason);
}

void print_sweep(std::ostream& out, const TuneResult& report) {
  const bool tokens = std::any_of(report.sweep.begin(), report.sweep.end(),
                                  [](const SweepRow& r) { return r.tokens_per_s > 0; });
  fmt::print(out, "\n  {:>8}  {:>12}  {:>7}{}  {:>10}  {:>6}  {:>6}  {:>9}  {:>22}\n", "batch",
             "samples/s", "±95 %", tokens ? fmt::format("  {:>12}", "tokens/s") : "", "step ms",
             "busy", "util", "GFLOP/s", "peak / capacity");
  std::vector<std::string> noisy;
  for (const auto& r : report.sweep) {
    const bool chosen = r.batch_size == report.selection.batch_size;
    if (r.noisy) {
      noisy.push_back(r.noise_cause.empty() ? std::to_string(r.batch_size)
                                            : fmt::format("{} ({})", r.batch_size, r.noise_cause));
    }
    fmt::print(out, "{} {:>8}  {:>12.1f}  {:>6}{}{}  {:>10.2f}  {:>5.0f}%  {:>6}  {:>9}  {:>10} / {:<10}\n",
               chosen ? ">" : " ", r.batch_size, r.samples_per_s,
               r.samples_per_s_ci.n > 0
                   ? fmt::format("{:.0f}%", 100 * r.samples_per_s_ci.relative_half_width())
                   : "n/a",
               r.noisy ? "!" : " ",
               tokens ? fmt::format("  {:>12.0f}", r.tokens_per_s) : "", r.step_ms, 100 * r.busy,
               r.utilization ? fmt::format("{:.0f}%", *r.utilization) : "n/a",
               r.flops_per_s ? fmt::format("{:.1f}", *r.flops_per_s / 1e9) : "n/a",
               format_bytes(r.peak_bytes), format_bytes(report.capacity_bytes));
  }
  if (!noisy.empty()) {
    fmt::print(out, "! noisy (interval wider than ±{:.0f} %): {}\n", 100 * kNoisyHalfWidth,
               fmt::join(noisy, "; "));
  }
  if (!report.utilization_note.empty()) {
    fmt::print(out, "util: {}\n", report.utilization_note);
  }
  if (!report.energy_note.empty()) fmt::print(out, "energy: {}\n", report.energy_note);
  if (report.selection.batch_size > 0) {
    fmt::print(out, "\nchosen batch size {}: {}\n", report.selection.batch_size,
               report.selection.reason);
  }
  if (!report.diagnosis.text.empty()) fmt::print(out, "diagnosis: {}\n", report.diagnosis.text);
}

namespace {

#ifndef BATCHTUNE_VERSION
#define BATCHTUNE_VERSION "unknown"
#endif

std::string now_utc() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M UTC", &tm);
  return text;
}

std::string trial_outcome(const TrialResult& t) {
  switch (t.failure) {
    case TrialFailure::kNone: return t.fits ? "fits" : "does not fit";
    case TrialFailure::kOutOfMemory: return "out of memory";
    case TrialFailure::kOverBudget: return "over the usable limit";
    case TrialFailure::kDoesNotRun: return "does not run";
  }
  return "";
}

/// The utilization plot's mean line: the run cut into this many windows.
constexpr double kUtilizationWindows = 80;

SvgSeries series(std::string name, std::string color) {
  SvgSeries s;
  s.name = std::move(name);
  s.color = std::move(color);
  return s;
}

SvgChart chart(std::string title, std::string x_label, std::string y_label, bool log2_x) {
  SvgChart c;
  c.title = std::move(title);
  c.x_label = std::move(x_label);
  c.y_label = std::move(y_label);
  c.log2_x = log2_x;
  return c;
}

std::string plan_html(const Plan& p) {
  std::string reasons;
  for (const auto& r : p.reasons) reasons += "<li>" + html_escape(r.text) + "</li>";
  for (const auto& w : p.warnings) reasons += "<li><b>warning:</b> " + html_escape(w) + "</li>";
  return fmt::format(
      "<h2>Plan</h2><p class='plan'>micro-batch <b>{}</b> &times; {} accumulation &times; {} "
      "process(es) = global batch <b>{}</b>; lr {:.6g} ({} scaling), warm-up {} steps; amp {}; "
      "{} loader worker(s), prefetch {}, pinned memory {}</p><ul>{}</ul>\n",
      p.micro_batch_size, p.accumulation_steps, p.world_size, p.global_batch_size, p.lr,
      lr_scaling_name(p.lr_scaling), p.warmup_steps, amp_name(p.amp), p.workers, p.prefetch,
      p.pin_memory ? "on" : "off", reasons);
}

}  // namespace

std::string html_report(const TuneResult& report) {
  const double max_fit = static_cast<double>(report.search.max_batch_size);
  const bool chosen = report.selection.batch_size > 0;
  SvgChart speed = chart("Throughput against batch size", "batch size", "samples/s", true);
  speed.y_unit = AxisUnit::kNumber;
  SvgChart memory = chart("Peak memory against batch size", "batch size", "peak memory", true);
  memory.y_unit = AxisUnit::kBytes;
  if (max_fit > 0) speed.highlight_x = memory.highlight_x = {max_fit};
  SvgSeries sps = series("samples/s (median, 95 % interval bars)", "#2e86de");
  SvgSeries peak = series("sweep peak", "#27ae60");
  SvgSeries gflops = series("GFLOP/s", "#16a085");
  for (const auto& r : report.sweep) {
    const double b = static_cast<double>(r.batch_size);
    sps.points.emplace_back(b, r.samples_per_s);
    // The median's 95 % interval (see Estimate).
    sps.error_bars.emplace_back(r.samples_per_s_ci.n > 0 ? r.samples_per_s_ci.low : r.samples_per_s,
                                r.samples_per_s_ci.n > 0 ? r.samples_per_s_ci.high : r.samples_per_s);
    peak.points.emplace_back(b, static_cast<double>(r.peak_bytes));
    if (r.flops_per_s) gflops.points.emplace_back(b, *r.flops_per_s / 1e9);
    if (r.batch_size == report.selection.batch_size) {
      const std::string label = fmt::format("chosen: {}", r.batch_size);
      speed.marker = {{b, r.samples_per_s}, label};
      memory.marker = {{b, static_cast<double>(r.peak_bytes)}, label};
    }
  }
  SvgSeries fit = series("search trial: fits", "#95a5a6");
  fit.line = false;
  SvgSeries failed = series("search trial: failed", "#c0392b");
  failed.line = false;
  failed.crosses = true;
  for (const auto& t : report.search.trials) {
    // A failed trial's peak is where it stopped; none known: at the capacity.
    const double y = static_cast<double>(t.peak_bytes > 0 ? t.peak_bytes : report.capacity_bytes);
    (t.fits ? fit : failed).points.emplace_back(static_cast<double>(t.batch_size), y);
  }
  std::sort(fit.points.begin(), fit.points.end());
  std::sort(failed.points.begin(), failed.points.end());
  speed.series.push_back(sps);
  memory.series.push_back(peak);
  if (!fit.points.empty()) memory.series.push_back(fit);
  if (!failed.points.empty()) memory.series.push_back(failed);
  memory.limits.push_back({static_cast<double>(report.capacity_bytes),
                           fmt::format("capacity {}", format_bytes(report.capacity_bytes)),
                           "#c0392b", false});
  if (report.usable_bytes > 0 && report.usable_bytes != report.capacity_bytes) {
    memory.limits.push_back({static_cast<double>(report.usable_bytes),
                             fmt::format("usable {} (fits are judged against it)",
                                         format_bytes(report.usable_bytes)),
                             "#d35400", true});
  }
  std::string flops_html;
  if (!gflops.points.empty()) {
    SvgChart flops_chart =
        chart("Achieved GFLOP/s against batch size", "batch size", "GFLOP/s", true);
    flops_chart.series.push_back(gflops);
    if (max_fit > 0) flops_chart.highlight_x = {max_fit};
    flops_html = render_svg(flops_chart);
  }

  std::string energy_html;
  SvgChart energy = chart("Energy per sample against batch size", "batch size", "J/sample", true);
  SvgSeries joules = series("J/sample", "#d35400");
  for (const auto& r : report.sweep) {
    if (!r.energy_j_per_sample) continue;
    joules.points.emplace_back(static_cast<double>(r.batch_size), *r.energy_j_per_sample);
    if (r.batch_size == report.selection.batch_size) {
      energy.marker = {{static_cast<double>(r.batch_size), *r.energy_j_per_sample},
                       fmt::format("chosen: {}", r.batch_size)};
    }
  }
  if (!joules.points.empty()) {
    energy.series.push_back(joules);
    energy_html = render_svg(energy);
  }
  if (!report.energy_note.empty()) {
    energy_html += fmt::format("<p class='note'>{}.</p>", html_escape(report.energy_note));
  }
  std::string goodput_html;
  if (!report.goodput.empty()) {
    goodput_html = fmt::format(
        "<h2>Goodput</h2><p>{}</p><table><tr><th>global batch</th><th>micro-batch</th>"
        "<th>accumulation</th><th>samples/s</th><th>efficiency</th><th>goodput</th></tr>\n",
        html_escape(report.noise && report.noise->noise_scale
                        ? fmt::format("Gradient noise scale {:.1f}, measured in {} steps of "
                                      "batch {} against {} on {}; base batch {}.",
                                      *report.noise->noise_scale, report.noise->steps,
                                      report.noise->small_batch, report.noise->big_batch,
                                      report.noise_data, report.goodput_base_batch)
                        : "Gradient noise scale not measured: " +
                              (report.noise ? report.noise->note : std::string("no run"))));
    for (const auto& c : report.goodput) {
      const bool is_choice = report.goodput_choice &&
                             c.global_batch_size == report.goodput_choice->global_batch_size;
      goodput_html += fmt::format(
          "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{:.1f}</td><td>{:.3f}</td><td>{:.1f}</td>"
          "</tr>\n",
          is_choice ? " class='chosen'" : "", c.global_batch_size, c.micro_batch_size,
          c.accumulation_steps, c.samples_per_s, c.efficiency, c.goodput);
    }
    goodput_html += "</table>";
  }

  std::string utilization_html;
  SvgChart util = chart("Device utilization over the run (shaded: the batch that ran)", "time",
                        "utilization", false);
  util.x_unit = AxisUnit::kSeconds;
  util.y_unit = AxisUnit::kPercent;
  util.y_max = 100;
  SvgSeries u = series("utilization", "#8e44ad");
  u.dots = false;
  u.stroke_width = 1.2;
  bool over_100 = false;
  for (const auto& p : report.timeline) {
    if (!p.utilization) continue;
    over_100 |= *p.utilization > 100.5;
    u.points.emplace_back(p.seconds, std::clamp(*p.utilization, 0.0, 100.0));
  }
  for (size_t i = 0, shown = 0; i < report.phases.size(); ++i) {
    const auto& ph = report.phases[i];
    // Trials of one stage at one batch in a row are one band with one label
    // (a confirmation trial, a sweep row's repeats), not a label each.
    if (i > 0 && ph.stage == report.phases[i - 1].stage &&
        ph.batch_size == report.phases[i - 1].batch_size) {
      util.bands.back().x1 = ph.end_s;
      continue;
    }
    const bool odd = shown++ % 2 == 1;
    const char* shade = ph.stage == "search"      ? (odd ? "#eeeeee" : "#e2e2e2")
                        : ph.stage == "precision" ? (odd ? "#fdf2e0" : "#fae5c3")
                                                  : (odd ? "#e3effa" : "#cfe3f6");
    util.bands.push_back({ph.start_s, ph.end_s, std::to_string(ph.batch_size), shade});
  }
  if (!u.points.empty()) {
    // The readings as a faint line, their mean over short windows on top:
    // hundreds of noisy samples alone read as a blob.
    const double span = u.points.back().first - u.points.front().first;
    const double window = std::max(span / kUtilizationWindows, 1e-9);
    SvgSeries mean = series(fmt::format("mean over {:.2g} s", window), "#6c3483");
    mean.dots = false;
    for (size_t i = 0; i < u.points.size();) {
      const double start = u.points[i].first;
      double sum = 0, at = 0;
      size_t n = 0;
      for (; i < u.points.size() && u.points[i].first < start + window; ++i, ++n) {
        sum += u.points[i].second;
        at += u.points[i].first;
      }
      mean.points.emplace_back(at / static_cast<double>(n), sum / static_cast<double>(n));
    }
    u.color = "#d2b4de";
    u.stroke_width = 0.8;
    util.series.push_back(u);
    util.series.push_back(mean);
    utilization_html =
        render_svg(util) +
        "<p class='note'>Orange bands: precision trials (fp32 and bf16 in turn); grey: search "
        "trials; blue: sweep trials; the number is the batch size that ran (trials of one "
        "batch in a row share a band; hover a narrow band for its batch)." +
        (over_100 ? " Readings above 100 % are drawn at 100 %." : "") + "</p>";
  } else {
    utilization_html = fmt::format("<p class='note'>Utilization over the run: unavailable ({}).</p>",
                                   html_escape(report.utilization_note.empty()
                                                   ? "no readings"
                                                   : report.utilization_note));
  }

  const bool tokens = std::any_of(report.sweep.begin(), report.sweep.end(),
                                  [](const SweepRow& r) { return r.tokens_per_s > 0; });
  std::string rows;
  for (const auto& r : report.sweep) {
    rows += fmt::format(
        "<tr{}><td>{}</td><td>{:.1f}</td>{}<td>{}</td><td>{:.2f}</td><td>{:.0f} %</td>"
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
        r.batch_size == report.selection.batch_size ? " class='chosen'" : "", r.batch_size,
        r.samples_per_s, tokens ? fmt::format("<td>{:.0f}</td>", r.tokens_per_s) : "",
        r.samples_per_s_ci.n > 0
            ? fmt::format("{:.1f} &ndash; {:.1f}{}", r.samples_per_s_ci.low, r.samples_per_s_ci.high,
                          r.noisy ? html_escape(" (noisy" + (r.noise_cause.empty() ? std::string()
                                                                : ": " + r.noise_cause) + ")")
                                  : "")
            : "n/a",
        r.step_ms, 100 * r.busy,
        r.utilization ? fmt::format("{:.0f} %", *r.utilization) : "n/a",
        r.flops_per_s ? fmt::format("{:.1f}", *r.flops_per_s / 1e9) : "n/a",
        format_bytes(r.peak_bytes),
        r.energy_j_per_sample ? fmt::format("{:.4f}", *r.energy_j_per_sample) : "n/a", r.steps);
  }
  std::string trial_rows;
  for (size_t i = 0; i < report.search.trials.size(); ++i) {
    const TrialResult& t = report.search.trials[i];
    trial_rows += fmt::format(
        "<tr class='{}'><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td class='text'>{}</td></tr>\n",
        t.fits ? "fit" : "failed", i + 1, t.batch_size, trial_outcome(t),
        format_bytes(t.peak_bytes), t.steps_run,
        t.fits && t.step_ms > 0 ? fmt::format("{:.2f}", t.step_ms) : "&ndash;",
        html_escape(first_line(t.error)));
  }

  std::string verdict;
  if (chosen) {
    verdict = fmt::format("<p><b>Chosen batch size: {}</b> &mdash; {}</p>",
                          report.selection.batch_size, html_escape(report.selection.reason));
  } else if (!report.complete) {
    verdict = "<p><b>No batch size chosen</b>: the run was interrupted before the sweep "
              "finished; the measurements below are those made until then.</p>";
  } else {
    verdict = fmt::format("<p><b>No batch size chosen</b>: {}</p>",
                          report.search.max_batch_size > 0
                              ? "the sweep timed no batch size"
                              : "not even batch 1 fits in the usable memory");
  }
  const std::string banner =
      report.complete
          ? std::string()
          : fmt::format("<div class='interrupted'><b>Interrupted</b>{}: this report is partial "
                        "&mdash; {} search trial(s) and {} sweep row(s) were measured before "
                        "the run stopped. Run tune again for the full result.</div>\n",
                        report.interrupted_by.empty() ? ""
                                                      : " by " + html_escape(report.interrupted_by),
                        report.search.trials.size(), report.sweep.size());
  return fmt::format(R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>batchtune report: {workload}</title>
<style>
body {{ font-family: sans-serif; margin: 2em auto; max-width: 1360px; color: #222; }}
h1 {{ font-size: 1.5em; margin-bottom: 0.2em; }} h2 {{ font-size: 1.15em; margin-top: 1.4em; }}
.note {{ color: #666; }}
.charts {{ display: flex; flex-wrap: wrap; gap: 12px; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 4px 10px; text-align: right; }}
td.text {{ text-align: left; max-width: 40em; }}
tr.chosen {{ background: #fdebd0; font-weight: bold; }} tr.failed {{ color: #a93226; }}
.verdict {{ background: #eef5fb; padding: 0.8em 1em; border-left: 4px solid #2e86de; }}
.interrupted {{ background: #fdecea; padding: 0.8em 1em; border-left: 4px solid #c0392b; margin: 1em 0; }}
code {{ background: #f4f4f4; padding: 2px 6px; word-break: break-all; }}
</style></head><body>
<h1>batchtune: {workload} on {device}</h1>
<p class="note">batchtune {version}, {date}; {threads} CPU thread(s); capacity {capacity}, usable {usable} ({margin:.0f} % margin); objective {objective}{command}</p>
{banner}<div class="verdict">{verdict}<p>{diagnosis}</p>
<p>Largest batch that fits: {max} ({stop}; {trials} trials, {steps} steps, {seconds:.1f} s).</p></div>
{plan}
<div class="charts">{speed}{memory}{flops}{energy}</div>
{util}
{goodput}
{tokens_section}
<h2>Sweep</h2>
<table><tr><th>batch</th><th>samples/s</th>{tokens_head}<th>95 % interval</th><th>step ms</th><th>busy</th><th>util</th><th>GFLOP/s</th><th>peak memory</th><th>J/sample</th><th>steps</th></tr>
{rows}</table>
<h2>Search trials</h2>
<p class="note">Strategy {strategy}; each trial is a real training step at that batch size.</p>
<table><tr><th>#</th><th>batch</th><th>outcome</th><th>peak memory</th><th>steps</th><th>step ms</th><th>message</th></tr>
{trial_rows}</table>
</body></html>
)",
                     fmt::arg("workload", html_escape(report.workload)),
                     fmt::arg("device", html_escape(report.device)), fmt::arg("threads", report.threads),
                     fmt::arg("version", BATCHTUNE_VERSION),
                     fmt::arg("date", html_escape(report.generated_at.empty() ? now_utc()
                                                                                : report.generated_at)),
                     fmt::arg("command", report.command_line.empty()
                                             ? std::string()
                                             : "<br>command: <code>" +
                                                   html_escape(report.command_line) + "</code>"),
                     fmt::arg("capacity", format_bytes(report.capacity_bytes)),
                     fmt::arg("usable", format_bytes(report.usable_bytes)),
                     fmt::arg("margin", report.margin * 100),
                     fmt::arg("objective", to_string(report.objective)),
                     fmt::arg("banner", banner), fmt::arg("verdict", verdict),
                     fmt::arg("diagnosis", html_escape(report.diagnosis.text)),
                     fmt::arg("max", report.search.max_batch_size),
                     fmt::arg("stop", html_escape(report.search.stop_reason)),
                     fmt::arg("trials", report.search.trials.size()),
                     fmt::arg("steps", report.search.steps),
                     fmt::arg("seconds", report.search.seconds),
                     fmt::arg("plan", report.plan ? plan_html(*report.plan) : std::string()),
                     fmt::arg("speed", render_svg(speed)), fmt::arg("memory", render_svg(memory)),
                     fmt::arg("flops", flops_html),
                     fmt::arg("util", utilization_html), fmt::arg("rows", rows),
                     fmt::arg("trial_rows", trial_rows),
                     fmt::arg("tokens_head", tokens ? "<th>tokens/s</th>" : ""),
                     fmt::arg("tokens_section", report.tokens ? tokens_html(*report.tokens) : ""),
                     fmt::arg("strategy", to_string(report.search.strategy)),
                     fmt::arg("energy", energy_html), fmt::arg("goodput", goodput_html));
}


ConsoleTuneReporter::ConsoleTuneReporter(std::ostream& out, std::ostream* progress)
    : out_(out), progress_(progress) {}

void ConsoleTuneReporter::clear_progress() {
  if (progress_ != nullptr) *progress_ << "\r\033[K" << std::flush;
}

void ConsoleTuneReporter::phase_started(TunePhase phase, const std::string& what) {
  clear_progress();
  trials_ = 0;
  switch (phase) {
    case TunePhase::kSearch:
      fmt::print(out_, "{}\n", what);
      break;
    case TunePhase::kSweep:
      fmt::print(out_, "\nsweep: {}\n", what);
      break;
    case TunePhase::kPlan:
      break;
    default:
      fmt::print(out_, "\n{}\n", what);
  }
  out_ << std::flush;  // progress for whoever reads a pipe (tee, a test)
}

void ConsoleTuneReporter::trial_started(TunePhase phase, int64_t batch_size) {
  if (progress_ == nullptr) return;
  *progress_ << fmt::format("\r\033[K{}: batch {} ...", phase == TunePhase::kSearch ? "trial"
                                                                                   : to_string(phase),
                            batch_size)
             << std::flush;
}

void ConsoleTuneReporter::trial_finished(TunePhase phase, const TrialResult& trial, size_t index) {
  (void)phase;
  ++trials_;
  if (progress_ == nullptr) return;
  *progress_ << "\r\033[K" << trial_progress_line(trial, index) << std::flush;
}

void ConsoleTuneReporter::phase_finished(TunePhase phase, const TuneResult& result) {
  clear_progress();
  switch (phase) {
    case TunePhase::kSearch:
      if (result.rank_max_batch_size) {
        fmt::print(out_, "rank 0: largest batch {} here, {} for the job (the smallest rank's)\n",
                   *result.rank_max_batch_size, result.search.max_batch_size);
      }
      print_search(out_, result.search);
      break;
    case TunePhase::kLengths:
      if (result.tokens) print_lengths(out_, *result.tokens);
      break;
    case TunePhase::kSweep:
      print_sweep(out_, result);
      break;
    case TunePhase::kNoise:
      if (result.noise && result.noise->noise_scale) {
        const NoiseScaleMeasurement& n = *result.noise;
        fmt::print(out_,
                   "noise scale {:.1f} (|G|^2 {:.4g}, tr(Sigma) {:.4g}; {} measurements of batch "
                   "{} against {}, {:.1f} s)\n",
                   *n.noise_scale, n.gradient_sq_norm.value_or(0), n.trace_covariance.value_or(0),
                   n.measurements, n.small_batch, n.big_batch, n.seconds);
      } else if (result.noise) {
        fmt::print(out_, "noise scale not measured: {}\n", result.noise->note);
      }
      print_goodput(out_, result);
      break;
    case TunePhase::kEval:
      if (result.eval_search) {
        fmt::print(out_, "largest evaluation batch {} in {} forward-only trial(s): {}\n",
                   result.eval_search->max_batch_size, result.eval_search->trials.size(),
                   result.eval_search->stop_reason);
      }
      break;
    case TunePhase::kLoader:
      fmt::print(out_, "{}", loader_table(result.loader));
      if (result.diagnosis.kind == "input-bound") {
        fmt::print(out_, "diagnosis: {}\n", result.diagnosis.text);
      }
      break;
    case TunePhase::kPlan:
      if (result.plan) {
        fmt::print(out_, "\n");
        print_plan(out_, *result.plan);
      }
      break;
    case TunePhase::kPrecision:
      // Said when it was measured; a mode asked for is in the plan.
      if (trials_ > 0) fmt::print(out_, "{}\n", result.amp_reason);
      break;
  }
  out_ << std::flush;
}

void ConsoleTuneReporter::finished(const TuneResult& result) {
  clear_progress();
  if (!result.complete) {
    size_t trials = result.search.trials.size();
    for (const auto& row : result.sweep) trials += row.steps > 0 ? 1 : 0;
    fmt::print(out_, "\ninterrupted by {}: writing what was measured so far ({} search trial(s), "
               "{} sweep row(s)), marked incomplete\n",
               result.interrupted_by, result.search.trials.size(), result.sweep.size());
  }
  if (!result.budget_note.empty()) fmt::print(out_, "time budget: {}\n", result.budget_note);
  out_ << std::flush;
}

FileTuneReporter::FileTuneReporter(Format format, std::function<void(const std::string&)> write)
    : format_(format), write_(std::move(write)) {}

void FileTuneReporter::finished(const TuneResult& result) {
  write_(format_ == Format::kJson ? to_json(result).dump(2) + "\n" : html_report(result));
}

void TuneReporters::phase_started(TunePhase phase, const std::string& what) {
  for (auto* r : reporters_) r->phase_started(phase, what);
}
void TuneReporters::trial_started(TunePhase phase, int64_t batch_size) {
  for (auto* r : reporters_) r->trial_started(phase, batch_size);
}
void TuneReporters::trial_finished(TunePhase phase, const TrialResult& trial, size_t index) {
  for (auto* r : reporters_) r->trial_finished(phase, trial, index);
}
void TuneReporters::phase_finished(TunePhase phase, const TuneResult& result) {
  for (auto* r : reporters_) r->phase_finished(phase, result);
}
void TuneReporters::finished(const TuneResult& result) {
  for (auto* r : reporters_) r->finished(result);
}

}  // namespace batchtune
