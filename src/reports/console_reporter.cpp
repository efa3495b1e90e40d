#include "batchtune/reports/console_reporter.h"

#include <fmt/ostream.h>

#include "batchtune/common/size.h"

namespace batchtune {

void print_environment(std::ostream& out, const Environment& env) {
  fmt::print(out, "LibTorch      {} ({})\n", env.torch_version,
             env.torch_cuda ? "built with CUDA" : "CPU only");
  if (env.cuda_available) {
    fmt::print(out, "CUDA          available, driver {}, {} device(s)\n",
               env.cuda_driver.empty() ? "unknown" : env.cuda_driver, env.gpus.size());
    for (const auto& gpu : env.gpus) {
      fmt::print(out, "  cuda:{}      {}, {} total, {} free, compute capability {}.{}\n",
                 gpu.index, gpu.name, format_bytes(gpu.total_bytes),
                 gpu.free_bytes ? format_bytes(*gpu.free_bytes) : "unknown",
                 gpu.compute_major, gpu.compute_minor);
    }
  } else {
    fmt::print(out, "CUDA          no GPU: {}\n", env.cuda_reason);
  }
  fmt::print(out, "NVML          {}\n",
             env.nvml_available ? "libnvidia-ml.so.1 loaded" : "unavailable: " + env.nvml_reason);
  fmt::print(out, "CPU           {}, {} cores, {} LibTorch thread(s)\n", env.cpu_model,
             env.cpu_cores, env.threads);
  fmt::print(out, "RAM           {} total, {} available\n", format_bytes(env.ram_total_bytes),
             format_bytes(env.ram_available_bytes));
}

void print_trial(std::ostream& out, const TrialResult& trial) {
  fmt::print(out, "batch size    {}\n", trial.batch_size);
  fmt::print(out, "fits          {}\n", trial.fits ? "yes" : "no: " + trial.error);
  fmt::print(out, "peak memory   {} of {} usable ({} capacity, {:.0f} % margin)\n",
             format_bytes(trial.peak_bytes), format_bytes(trial.usable_bytes),
             format_bytes(trial.capacity_bytes), trial.margin * 100);
  if (trial.fits) {
    const Estimate& ms = trial.step_ms_ci;
    fmt::print(out,
               "step          {:.2f} ms median over {} timed steps after {} warm-up, {} "
               "interval [{:.2f}, {:.2f}] ms\n",
               trial.step_ms, trial.step_seconds.size(), trial.warmup_steps_run,
               format_level(ms.level), ms.low, ms.high);
    fmt::print(out, "throughput    {:.1f} samples/s [{:.1f}, {:.1f}]{}\n", trial.samples_per_s,
               trial.samples_per_s_ci.low, trial.samples_per_s_ci.high,
               trial.noisy ? fmt::format(" — noisy (wider than ±{:.0f} %){}", 100 * kNoisyHalfWidth,
                                         trial.noise_cause.empty() ? "" : ": " + trial.noise_cause)
                           : "");
  }
}

std::string trial_progress_line(const TrialResult& trial, size_t index) {
  return fmt::format("trial {}: batch {} ... {}", index + 1, trial.batch_size,
                     trial.fits ? fmt::format("fits, peak {}", format_bytes(trial.peak_bytes))
                                : "does not fit");
}

void print_search(std::ostream& out, const SearchResult& search) {
  fmt::print(out, "{:>5}  {:>10}  {:<13}  {:>12}  {:>10}\n", "trial", "batch", "fits",
             "peak", "step ms");
  for (size_t i = 0; i < search.trials.size(); ++i) {
    const TrialResult& t = search.trials[i];
    const char* fits = t.fits                                     ? "yes"
                       : t.failure == TrialFailure::kOverBudget ? "no (budget)"
                       : t.failure == TrialFailure::kDoesNotRun ? "no (refused)"
                                                                : "no (OOM)";
    fmt::print(out, "{:>5}  {:>10}  {:<13}  {:>12}  {:>10}\n", i + 1, t.batch_size, fits,
               format_bytes(t.peak_bytes), t.fits ? fmt::format("{:.1f}", t.step_ms) : "-");
  }
  if (!search.trials.empty()) {
    const TrialResult& t = search.trials.front();
    fmt::print(out, "usable memory {} ({} capacity less {:.0f} % margin)\n",
               format_bytes(t.usable_bytes), format_bytes(t.capacity_bytes), t.margin * 100);
  }
  fmt::print(out, "largest batch that fits: {} ({}; {} trials, {} steps, {:.1f} s, strategy {})\n",
             search.max_batch_size, search.stop_reason, search.trials.size(), search.steps,
             search.seconds, to_string(search.strategy));
}

namespace {

constexpr const char* kMissing = "n/a";

template <typename T, typename Format>
std::string or_missing(const std::optional<T>& value, Format format) {
  return value ? format(*value) : kMissing;
}

}  // namespace

void print_monitor_header(std::ostream& out, const Sampler& sampler, double interval_ms,
                          const std::string& gpu_reason) {
  fmt::print(out, "# batchtune monitor: {}, every {:g} ms\n", sampler.describe(), interval_ms);
  const std::string reason = sampler.unavailable_reason();
  if (!reason.empty()) fmt::print(out, "# n/a: {}\n", reason);
  if (!gpu_reason.empty()) fmt::print(out, "# GPU utilization unavailable: {}\n", gpu_reason);
  fmt::print(out, "# {:>8}  {:<7} {:>6} {:>11} {:>8} {:>12}\n", "time_s", "device", "util%",
             "memory", "power_W", "energy_J");
}

void print_samples(std::ostream& out, const std::vector<Sample>& samples, double start_s) {
  for (const auto& s : samples) {
    fmt::print(out, "  {:>8.3f}  {:<7} {:>6} {:>11} {:>8} {:>12}\n", s.time_s - start_s,
               s.device,
               or_missing(s.utilization_percent, [](double v) { return fmt::format("{:.1f}", v); }),
               or_missing(s.memory_used_bytes, [](int64_t v) { return format_bytes(v); }),
               or_missing(s.power_watts, [](double v) { return fmt::format("{:.1f}", v); }),
               or_missing(s.energy_joules, [](double v) { return fmt::format("{:.1f}", v); }));
  }
  out.flush();
}

}  // namespace batchtune
