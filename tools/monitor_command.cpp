#include <fmt/format.h>

#include <iostream>
#include <mutex>

#include "batchtune/reports/console_reporter.h"
#include "batchtune/common/error.h"
#include "batchtune/reports/json_reporter.h"
#include "batchtune/monitoring/monitor.h"
#include "commands.h"

namespace batchtune::cli {
namespace {

/// Below 10 ms, /proc's CPU time (10 ms ticks) reads as noise, and NVML
/// updates utilization only every 1/6 s or so anyway.
constexpr int64_t kMinIntervalMs = 10;
/// A day between samples at most: past it the interval is a typo, and
/// milliseconds near int64's limit overflow the clock's arithmetic.
constexpr int64_t kMaxIntervalMs = int64_t{24} * 3600 * 1000;

struct MonitorFlags {
  int64_t interval_ms = static_cast<int64_t>(kDefaultMonitorIntervalMs);
  int64_t count = 0;
  std::string device = "auto";
  int pid = 0;
  bool json = false;
};

std::unique_ptr<Sampler> make_flagged_sampler(const MonitorFlags& flags) {
  if (flags.pid == 0) return make_sampler(flags.device);
  if (flags.device != "auto" && flags.device != "cpu") {
    throw Error(fmt::format("--pid: watches a process's CPU use; drop --device {} or use cpu",
                            flags.device));
  }
  try {
    return std::make_unique<ProcessCpuSampler>(flags.pid);
  } catch (const Error& e) {
    throw Error(std::string("--pid: ") + e.what());
  }
}

int run_monitor(const MonitorFlags& flags) {
  if (flags.interval_ms < kMinIntervalMs || flags.interval_ms > kMaxIntervalMs) {
    throw Error(fmt::format("--interval: must be from {} to {} ms, got {}", kMinIntervalMs,
                            kMaxIntervalMs, flags.interval_ms));
  }
  if (flags.count < 0) {
    throw Error(fmt::format("--count: must be 0 (until interrupted) or more, got {}", flags.count));
  }
  if (flags.pid < 0) throw Error(fmt::format("--pid: must be a process id, got {}", flags.pid));
  std::unique_ptr<Sampler> sampler = make_flagged_sampler(flags);
  // Watching the CPU, say why not a GPU (if that is why).
  const bool watches_cpu = dynamic_cast<const ProcessCpuSampler*>(sampler.get()) != nullptr;
  const std::string gpu_reason = watches_cpu ? gpu_unavailable_reason() : "";
  const double start_s = steady_clock().now_s();
  if (flags.json) {
    std::cout << nlohmann::json{{"sampler", sampler->describe()},
                                {"interval_ms", flags.interval_ms},
                                {"unavailable", sampler->unavailable_reason()},
                                {"gpu_unavailable", gpu_reason}}
                     .dump()
              << std::endl;
  } else {
    print_monitor_header(std::cout, *sampler, static_cast<double>(flags.interval_ms), gpu_reason);
  }
  const bool json = flags.json;
  Monitor monitor(std::move(sampler),
                  MonitorOptions()
                      .interval_ms(static_cast<double>(flags.interval_ms))
                      .rounds(flags.count)
                      .keep_samples(false)
                      .on_sample([json, start_s](const std::vector<Sample>& samples) {
                        if (!json) return print_samples(std::cout, samples, start_s);
                        for (const auto& s : samples) std::cout << to_json(s, start_s).dump() << "\n";
                        std::cout.flush();
                      }));
  monitor.wait();
  return 0;
}

}  // namespace

CommandRun add_monitor_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "monitor", "print utilization, memory, power and energy at an interval, like nvidia-smi dmon");
  auto flags = std::make_shared<MonitorFlags>();
  cmd->add_option("--interval", flags->interval_ms, "milliseconds between samples")
      ->capture_default_str();
  cmd->add_option("--count", flags->count, "samples to print, then exit; 0: until interrupted")
      ->capture_default_str();
  cmd->add_option("--device", flags->device,
                  "auto (every GPU, else this process's CPU), cpu, cuda or cuda:N")
      ->capture_default_str();
  cmd->add_option("--pid", flags->pid, "on the CPU, watch this process instead of batchtune");
  cmd->add_flag("--json", flags->json,
                "print JSON lines: a heading object, then one object per sample");
  return [flags] { return run_monitor(*flags); };
}

}  // namespace batchtune::cli
