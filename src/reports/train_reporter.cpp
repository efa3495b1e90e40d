#include "batchtune/reports/train_reporter.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "batchtune/common/size.h"
#include "batchtune/training/loss_target.h"

namespace batchtune {
namespace {

constexpr int kBarWidth = 24;

/// "test accuracy 85.00 %" or "training loss 1.5000".
std::string describe_target(const TrainTarget& t) {
  if (t.metric == "test_accuracy") return fmt::format("test accuracy {:.2f} %", t.value * 100);
  if (t.metric == "train_loss") return "training loss " + format_loss(t.value);
  return fmt::format("{} {:.4g}", t.metric, t.value);
}

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s / 60) % 60);
  return fmt::format("{}m{:02}s", s / 60, s % 60);
}

}  // namespace

void print_plan(std::ostream& out, const Plan& p) {
  const std::string schedule = fmt::format(
      "lr {:.6g} ({}), warm-up {} steps, amp {}", p.lr,
      p.lr_scaling == LrScaling::kNone ? std::string("not scaled")
                                       : lr_scaling_name(p.lr_scaling) + " scaling",
      p.warmup_steps, amp_name(p.amp));
  if (p.token_budget > 0) {
    // Its steps hold tokens, not a fixed count of samples: no global batch.
    out << fmt::format("plan: token budget {} padded tokens per micro-batch, micro-batches "
                       "accumulated until a step holds {} real tokens (--target-tokens) over {} "
                       "process(es); {}\n",
                       p.token_budget,
                       p.tokens_per_step > 0 ? p.tokens_per_step : p.token_budget * p.world_size,
                       p.world_size, schedule);
  } else {
    out << fmt::format("plan: micro-batch {} x {} accumulation x {} process(es) = global batch "
                       "{}; {}\n",
                       p.micro_batch_size, p.accumulation_steps, p.world_size,
                       p.global_batch_size, schedule);
  }
  if (p.token_budget > 0) {
    std::string buckets;
    for (const auto& b : p.length_buckets) {
      buckets += fmt::format("{}{} x {}", buckets.empty() ? "" : ", ", b.micro_batch_size,
                             b.max_length);
    }
    out << fmt::format("token budget: {} tokens per micro-batch; length buckets (samples x "
                       "tokens): {}\n",
                       p.token_budget, buckets);
  }
  for (const auto& reason : p.reasons) out << "  - " << reason.text << "\n";
  for (const auto& warning : p.warnings) out << "warning: " << warning << "\n";
}

std::string TrainConsoleReporter::log_line(const TrainEvent& e) {
  return fmt::format(
      "step {}/{}  epoch {}  loss {:.4f}  lr {:.3g}  {:.0f} samples/s  busy {:.0f} %  util {}  "
      "mem {} / peak {} / {}  noise scale {}",
      e.step, e.total_steps, e.epoch + 1, e.loss, e.lr, e.samples_per_s, e.busy_fraction * 100,
      e.utilization ? fmt::format("{:.0f} %", *e.utilization * 100) : std::string("n/a"),
      format_bytes(e.memory_used_bytes), format_bytes(e.memory_peak_bytes),
      format_bytes(e.memory_capacity_bytes),
      e.noise_scale ? fmt::format("{:.0f}", *e.noise_scale) : std::string("n/a"));
}

std::string TrainConsoleReporter::progress_bar(const TrainEvent& e) {
  const double done = e.total_steps > 0 ? static_cast<double>(e.step) /
                                              static_cast<double>(e.total_steps)
                                        : 0;
  const int filled = static_cast<int>(done * kBarWidth);
  return fmt::format("[{}{}] {}/{} epoch {}/{} loss {:.4f} {:.0f} samples/s ETA {}",
                     std::string(static_cast<size_t>(filled), '#'),
                     std::string(static_cast<size_t>(kBarWidth - filled), '.'), e.step,
                     e.total_steps, e.epoch + 1, e.epochs, e.loss, e.samples_per_s,
                     format_duration(e.eta_s));
}

void TrainConsoleReporter::clear_bar() {
  if (!bar_shown_) return;
  out_ << "\r\033[K";
  bar_shown_ = false;
}

void TrainConsoleReporter::report(const TrainEvent& e) {
  using Kind = TrainEvent::Kind;
  if (e.kind == Kind::kProgress) {
    if (!terminal_) return;
    out_ << "\r\033[K" << progress_bar(e) << std::flush;
    bar_shown_ = true;
    return;
  }
  clear_bar();
  switch (e.kind) {
    case Kind::kLog: out_ << log_line(e) << "\n"; break;
    case Kind::kEpochEnd:
      out_ << fmt::format("epoch {} done at step {}: loss {:.4f}{}\n", e.epoch + 1, e.step,
                          e.loss,
                          e.test_accuracy
                              ? fmt::format(", test accuracy {:.2f} %", *e.test_accuracy * 100)
                              : std::string());
      break;
    case Kind::kEvaluation:
      out_ << fmt::format("step {}: loss {:.4f}, test accuracy {:.2f} %\n", e.step, e.loss,
                          e.test_accuracy.value_or(0) * 100);
      break;
    case Kind::kTargetReached:
    case Kind::kOomRecovery:
    case Kind::kCheckpoint:
    case Kind::kBatchChange:
    case Kind::kDivergence:
    case Kind::kResumed: out_ << e.message << "\n"; break;
    case Kind::kProgress: break;
  }
  out_ << std::flush;
}

void TrainConsoleReporter::summary(const TrainSummary& s) {
  clear_bar();
  const auto average = [&](int64_t count) {
    return s.steps > 0 ? static_cast<double>(count) / static_cast<double>(s.steps) : 0.0;
  };
  // A token-budget step holds micro-batches of varying sample counts.
  const std::string step_holds =
      s.target_tokens > 0
          ? fmt::format("a step held {:.0f} tokens (target {}) in {:.1f} samples, {:.1f} "
                        "micro-batches on average",
                        average(s.tokens), s.target_tokens, average(s.samples),
                        average(s.micro_batches))
      : s.micro_batch_size * s.accumulation_steps == s.global_batch_size
          ? fmt::format("micro-batch {} x {} = {}", s.micro_batch_size, s.accumulation_steps,
                        s.global_batch_size)
          // Text of fewer samples than a step takes: "4 x 1 = 1" was no product.
          : fmt::format("micro-batches of up to {} x {}, {:.1f} samples a step on average",
                        s.micro_batch_size, s.accumulation_steps, average(s.samples));
  out_ << fmt::format(
      "trained {} steps ({:.2f} epochs, {} samples) in {:.1f} s: {:.0f} samples/s; final loss "
      "{:.4f}; test accuracy {}; {} out-of-memory recoveries; {}; gradient noise scale {}\n",
      s.steps, s.epochs, s.samples, s.seconds, s.samples_per_s, s.final_loss,
      s.test_accuracy ? fmt::format("{:.2f} %", *s.test_accuracy * 100) : std::string("n/a"),
      s.oom_recoveries, step_holds,
      s.noise_scale ? fmt::format("{:.0f}", *s.noise_scale) : std::string("n/a"));
  if (s.tokens > 0) {
    out_ << fmt::format("tokens: {} real of {} computed ({:.1f} % padding), {:.0f} tokens/s{}\n",
                        s.tokens, s.padded_tokens,
                        s.padded_tokens > 0 ? 100.0 * (1.0 - static_cast<double>(s.tokens) /
                                                                 static_cast<double>(s.padded_tokens))
                                            : 0.0,
                        s.tokens_per_s,
                        s.token_budget > 0 ? fmt::format("; token budget {} at the end",
                                                         s.token_budget)
                                           : "");
  }
  if (s.target) {
    out_ << (s.target_reached && s.steps_to_target && s.seconds_to_target && s.samples_to_target
                 ? fmt::format("target {}: reached at step {} ({} samples, {:.1f} s of training)\n",
                               describe_target(*s.target), *s.steps_to_target,
                               *s.samples_to_target, *s.seconds_to_target)
                 : fmt::format("target {}: not reached in {} steps\n",
                               describe_target(*s.target), s.steps));
  }
  if (!s.batch_schedule.empty()) {
    // --adapt: the global batch and lr over the steps, one line per change.
    out_ << fmt::format("--adapt: {} change(s) of the global batch{}:\n",
                        s.batch_schedule.size() - 1, s.target_tokens > 0 ? " (in tokens)" : "");
    for (size_t i = 0; i < s.batch_schedule.size(); ++i) {
      const BatchChange& c = s.batch_schedule[i];
      const int64_t until = i + 1 < s.batch_schedule.size() ? s.batch_schedule[i + 1].step : s.steps;
      out_ << fmt::format("  steps {}-{}: global batch {} ({} x {}), lr {:.3g}{}\n", c.step + 1,
                          until, c.global_batch_size, c.micro_batch_size, c.accumulation_steps,
                          c.lr,
                          c.noise_scale ? fmt::format(", noise scale {:.0f}", *c.noise_scale)
                                        : std::string());
    }
  }
  if (s.time_limit_reached) {
    out_ << fmt::format("stopped at the time limit after step {} ({:.1f} s of training)\n",
                        s.steps, s.seconds);
  }
  if (!s.complete) {
    out_ << fmt::format("stopped early by {} after step {}: the summary is partial\n",
                        s.interrupted_by, s.steps);
  }
}

}  // namespace batchtune
