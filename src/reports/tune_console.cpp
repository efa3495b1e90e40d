#include "batchtune/reports/tune_console.h"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "batchtune/common/size.h"

namespace batchtune {
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
  // GFLOP/s with the MFU beside it where the device's peak is known.
  const int flops_width = report.peak_flops ? 20 : 9;
  fmt::print(out, "\n  {:>8}  {:>12}  {:>7}{}  {:>10}  {:>6}  {:>6}  {:>{}}  {:>22}\n", "batch",
             "samples/s", "±95 %", tokens ? fmt::format("  {:>12}", "tokens/s") : "", "step ms",
             "busy", "util", "GFLOP/s", flops_width, "peak / capacity");
  const auto gflops = [](const SweepRow& r) {
    if (!r.flops_per_s) return std::string("n/a");
    return r.mfu ? fmt::format("{:.1f} ({:.1f}% MFU)", *r.flops_per_s / 1e9, 100 * *r.mfu)
                 : fmt::format("{:.1f}", *r.flops_per_s / 1e9);
  };
  std::vector<std::string> noisy;
  for (const auto& r : report.sweep) {
    const bool chosen = r.batch_size == report.selection.batch_size;
    if (r.noisy) {
      noisy.push_back(r.noise_cause.empty() ? std::to_string(r.batch_size)
                                            : fmt::format("{} ({})", r.batch_size, r.noise_cause));
    }
    fmt::print(out, "{} {:>8}  {:>12.1f}  {:>6}{}{}  {:>10.2f}  {:>5.0f}%  {:>6}  {:>{}}  {:>10} / {:<10}\n",
               chosen ? ">" : " ", r.batch_size, r.samples_per_s,
               r.samples_per_s_ci.n > 0
                   ? fmt::format("{:.0f}%", 100 * r.samples_per_s_ci.relative_half_width())
                   : "n/a",
               r.noisy ? "!" : " ",
               tokens ? fmt::format("  {:>12.0f}", r.tokens_per_s) : "", r.step_ms, 100 * r.busy,
               r.utilization ? fmt::format("{:.0f}%", *r.utilization) : "n/a",
               gflops(r), flops_width, format_bytes(r.peak_bytes),
               format_bytes(report.capacity_bytes));
  }
  if (report.peak_flops) {
    fmt::print(out, "MFU: over the {} peak {:.1f} TFLOP/s of {} ({})\n", report.peak_flops->precision,
               report.peak_flops->flops_per_s / 1e12, report.peak_flops->gpu,
               report.peak_flops->source);
  } else if (!report.mfu_note.empty() && !report.sweep.empty() && report.sweep.front().flops_per_s) {
    fmt::print(out, "MFU: n/a ({})\n", report.mfu_note);
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

}  // namespace batchtune
