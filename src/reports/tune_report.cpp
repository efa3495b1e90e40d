#include "batchtune/reports/tune_report.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include "batchtune/reports/console_reporter.h"
#include "batchtune/reports/json_reporter.h"
#include "batchtune/reports/train_reporter.h"
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

}  // namespace

nlohmann::json to_json(const TuneResult& report) {
  nlohmann::json out = to_json(report.search);
  const auto finish = [&](nlohmann::json& j) {
    j["amp"] = amp_name(report.amp);
    j["amp_reason"] = report.amp_reason;
    j["time_budget_s"] = report.time_budget_s;
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
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : report.sweep) {
    rows.push_back({{"batch_size", r.batch_size},
                    {"amp", amp_name(r.amp)},
                    {"samples_per_s", r.samples_per_s},
                    {"samples_per_s_spread", r.samples_per_s_spread},
                    {"step_ms", r.step_ms},
                    {"busy", r.busy},
                    {"utilization", optional_json(r.utilization)},
                    {"peak_bytes", r.peak_bytes},
                    {"energy_j_per_sample", optional_json(r.energy_j_per_sample)},
                    {"flops_per_s", optional_json(r.flops_per_s)},
                    {"steps", r.steps}});
  }
  out["workload"] = report.workload;
  out["device"] = report.device;
  out["threads"] = report.threads;
  out["capacity_bytes"] = report.capacity_bytes;
  out["usable_bytes"] = report.usable_bytes;
  out["margin"] = report.margin;
  out["sweep"] = rows;
  out["objective"] = to_string(report.objective);
  out["chosen_batch_size"] = report.selection.batch_size > 0
                                 ? nlohmann::json(report.selection.batch_size)
                                 : nlohmann::json(nullptr);
  out["reason"] = report.selection.reason;
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
  fmt::print(out, "\n  {:>8}  {:>12}  {:>10}  {:>6}  {:>6}  {:>9}  {:>22}\n", "batch",
             "samples/s", "step ms", "busy", "util", "GFLOP/s", "peak / capacity");
  for (const auto& r : report.sweep) {
    const bool chosen = r.batch_size == report.selection.batch_size;
    fmt::print(out, "{} {:>8}  {:>12.1f}  {:>10.2f}  {:>5.0f}%  {:>6}  {:>9}  {:>10} / {:<10}\n",
               chosen ? ">" : " ", r.batch_size, r.samples_per_s, r.step_ms, 100 * r.busy,
               r.utilization ? fmt::format("{:.0f}%", *r.utilization) : "n/a",
               r.flops_per_s ? fmt::format("{:.1f}", *r.flops_per_s / 1e9) : "n/a",
               format_bytes(r.peak_bytes), format_bytes(report.capacity_bytes));
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

std::string html_report(const TuneResult& report) {
  SvgChart speed{"Throughput against batch size", "batch size", "samples/s", true, {}, {}, {}};
  SvgChart memory{"Peak memory against batch size", "batch size", "bytes", true, {}, {}, {}};
  SvgSeries sps{"samples/s", "#2e86de", {}};
  SvgSeries peak{"peak memory", "#27ae60", {}};
  for (const auto& r : report.sweep) {
    sps.points.emplace_back(static_cast<double>(r.batch_size), r.samples_per_s);
    peak.points.emplace_back(static_cast<double>(r.batch_size), static_cast<double>(r.peak_bytes));
    if (r.batch_size == report.selection.batch_size) {
      const std::string label = fmt::format("chosen: {}", r.batch_size);
      speed.marker = {{static_cast<double>(r.batch_size), r.samples_per_s}, label};
      memory.marker = {{static_cast<double>(r.batch_size), static_cast<double>(r.peak_bytes)}, label};
    }
  }
  SvgSeries trials{"search trials (fit)", "#95a5a6", {}};
  for (const auto& t : report.search.trials) {
    if (t.fits) trials.points.emplace_back(static_cast<double>(t.batch_size), static_cast<double>(t.peak_bytes));
  }
  std::sort(trials.points.begin(), trials.points.end());
  speed.series.push_back(sps);
  memory.series.push_back(peak);
  if (!trials.points.empty()) memory.series.push_back(trials);
  memory.limit = {static_cast<double>(report.capacity_bytes),
                  fmt::format("capacity {}", format_bytes(report.capacity_bytes))};

  std::string energy_html;
  SvgChart energy{"Energy per sample against batch size", "batch size", "J/sample", true, {}, {}, {}};
  SvgSeries joules{"J/sample", "#d35400", {}};
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
      const bool chosen = report.goodput_choice &&
                          c.global_batch_size == report.goodput_choice->global_batch_size;
      goodput_html += fmt::format(
          "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{:.1f}</td><td>{:.3f}</td><td>{:.1f}</td>"
          "</tr>\n",
          chosen ? " class='chosen'" : "", c.global_batch_size, c.micro_batch_size,
          c.accumulation_steps, c.samples_per_s, c.efficiency, c.goodput);
    }
    goodput_html += "</table>";
  }

  std::string utilization_html;
  SvgChart util{"Device utilization over the run", "seconds", "utilization %", false, {}, {}, {}};
  SvgSeries u{"utilization", "#8e44ad", {}};
  for (const auto& p : report.timeline) {
    if (p.utilization) u.points.emplace_back(p.seconds, *p.utilization);
  }
  if (!u.points.empty()) {
    util.series.push_back(u);
    util.limit = {100.0, "100 %"};
    utilization_html = render_svg(util);
  } else {
    utilization_html = fmt::format("<p class='note'>Utilization over the run: unavailable ({}).</p>",
                                   html_escape(report.utilization_note.empty()
                                                   ? "no readings"
                                                   : report.utilization_note));
  }

  std::string rows;
  for (const auto& r : report.sweep) {
    rows += fmt::format(
        "<tr{}><td>{}</td><td>{:.1f}</td><td>{:.2f}</td><td>{:.0f} %</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
        r.batch_size == report.selection.batch_size ? " class='chosen'" : "", r.batch_size,
        r.samples_per_s, r.step_ms, 100 * r.busy,
        r.utilization ? fmt::format("{:.0f} %", *r.utilization) : "n/a", format_bytes(r.peak_bytes),
        r.energy_j_per_sample ? fmt::format("{:.4f}", *r.energy_j_per_sample) : "n/a");
  }
  return fmt::format(R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>batchtune report: {workload}</title>
<style>
body {{ font-family: sans-serif; margin: 2em auto; max-width: 1360px; color: #222; }}
h1 {{ font-size: 1.5em; }} .note {{ color: #666; }}
.charts {{ display: flex; flex-wrap: wrap; gap: 12px; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 4px 10px; text-align: right; }}
tr.chosen {{ background: #fdebd0; font-weight: bold; }}
.verdict {{ background: #eef5fb; padding: 0.8em 1em; border-left: 4px solid #2e86de; }}
</style></head><body>
<h1>batchtune: {workload} on {device}</h1>
<p class="note">{threads} CPU thread(s); capacity {capacity}, usable {usable} ({margin:.0f} % margin); {complete}</p>
<div class="verdict"><p><b>Chosen batch size: {chosen}</b> — {reason}</p><p>{diagnosis}</p>
<p>Largest batch that fits: {max} ({stop}; {trials} trials, {steps} steps, {seconds:.1f} s).</p></div>
<div class="charts">{speed}{memory}{energy}</div>
{util}
{goodput}
<table><tr><th>batch</th><th>samples/s</th><th>step ms</th><th>busy</th><th>util</th><th>peak memory</th><th>J/sample</th></tr>
{rows}</table>
</body></html>
)",
                     fmt::arg("workload", html_escape(report.workload)),
                     fmt::arg("device", html_escape(report.device)), fmt::arg("threads", report.threads),
                     fmt::arg("capacity", format_bytes(report.capacity_bytes)),
                     fmt::arg("usable", format_bytes(report.usable_bytes)),
                     fmt::arg("margin", report.margin * 100),
                     fmt::arg("complete", report.complete ? "complete run" : "INCOMPLETE: interrupted"),
                     fmt::arg("chosen", report.selection.batch_size),
                     fmt::arg("reason", html_escape(report.selection.reason)),
                     fmt::arg("diagnosis", html_escape(report.diagnosis.text)),
                     fmt::arg("max", report.search.max_batch_size),
                     fmt::arg("stop", html_escape(report.search.stop_reason)),
                     fmt::arg("trials", report.search.trials.size()),
                     fmt::arg("steps", report.search.steps),
                     fmt::arg("seconds", report.search.seconds),
                     fmt::arg("speed", render_svg(speed)), fmt::arg("memory", render_svg(memory)),
                     fmt::arg("util", utilization_html), fmt::arg("rows", rows),
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
