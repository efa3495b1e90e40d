#include "batchtune/tune_report.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include "batchtune/json_reporter.h"
#include "batchtune/size.h"
#include "svg_chart.h"

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

nlohmann::json to_json(const TuneReport& report) {
  nlohmann::json out = to_json(report.search);
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : report.sweep) {
    rows.push_back({{"batch_size", r.batch_size},
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
  out["complete"] = report.complete;
  return out;
}

void print_sweep(std::ostream& out, const TuneReport& report) {
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
  if (report.selection.batch_size > 0) {
    fmt::print(out, "\nchosen batch size {}: {}\n", report.selection.batch_size,
               report.selection.reason);
  }
  if (!report.diagnosis.text.empty()) fmt::print(out, "diagnosis: {}\n", report.diagnosis.text);
}

std::string html_report(const TuneReport& report) {
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
<div class="charts">{speed}{memory}</div>
{util}
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
                     fmt::arg("util", utilization_html), fmt::arg("rows", rows));
}

}  // namespace batchtune
