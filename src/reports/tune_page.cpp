#include "batchtune/reports/tune_page.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <ctime>

#include "batchtune/common/error.h"
#include "batchtune/common/precision.h"
#include "batchtune/common/size.h"
#include "reports/svg_chart.h"

namespace batchtune {
namespace {

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
      "{} loader worker(s), prefetch {}, pinned memory {}{}{}</p><ul>{}</ul>\n",
      p.micro_batch_size, p.accumulation_steps, p.world_size, p.global_batch_size, p.lr,
      lr_scaling_name(p.lr_scaling), p.warmup_steps, amp_name(p.amp), p.workers, p.prefetch,
      p.pin_memory ? "on" : "off", p.checkpointing ? "; activation checkpointing on" : "",
      p.memory_format == "channels_last" ? "; channels_last" : "", reasons);
}

/// A compiled model's compile phase, in the verdict: its seconds, graphs and
/// recompiles, and what its time was charged to.
std::string compile_html(const std::optional<CompileRecord>& compile) {
  if (!compile) return "";
  return fmt::format("<p>Compiled: {:.1f} s compiling, {} graph(s), {} recompile(s) in the trials. "
                     "{}</p>",
                     compile->seconds, compile->graphs, compile->recompiles,
                     html_escape(compile->note));
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
        r.flops_per_s ? fmt::format("{:.1f}{}", *r.flops_per_s / 1e9,
                                    r.mfu ? fmt::format(" ({:.1f} % MFU)", 100 * *r.mfu) : "")
                      : "n/a",
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
<p>Largest batch that fits: {max} ({stop}; {trials} trials, {steps} steps, {seconds:.1f} s).</p>{compile}</div>
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
                     fmt::arg("compile", compile_html(report.compile)),
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

}  // namespace batchtune
