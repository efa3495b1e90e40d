#pragma once

#include <torch/arg.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "batchtune/common/clock.h"
#include "batchtune/monitoring/sampler.h"

namespace batchtune {

/// Called from the monitor's thread with each round of samples (one per
/// device), as they are taken.
using SampleCallback = std::function<void(const std::vector<Sample>&)>;

/// The monitor's default interval: fine enough to see a trial of a few
/// seconds, coarse enough that NVML (which updates utilization every 1/6 to
/// 1 s) and /proc (10 ms ticks) give meaningful numbers.
constexpr double kDefaultMonitorIntervalMs = 200;

/// How a `Monitor` samples.
struct MonitorOptions {
  /// Time between rounds of samples. The first round is one interval after
  /// the start, so that rates (CPU time, energy) cover a whole interval.
  TORCH_ARG(double, interval_ms) = kDefaultMonitorIntervalMs;
  /// Rounds to take before the thread ends by itself; 0 for no limit.
  TORCH_ARG(int64_t, rounds) = 0;
  /// Keep every sample for `samples()` and `summarize()`. Off for a monitor
  /// that only prints, so that its memory does not grow over days.
  TORCH_ARG(bool, keep_samples) = true;
  /// Called with each round, in the monitor's thread.
  TORCH_ARG(SampleCallback, on_sample) = nullptr;
};

/// One device's samples over a window of time.
struct SampleSummary {
  std::string device;
  int64_t samples = 0;
  /// Mean of the utilization readings in the window; empty when none.
  std::optional<double> mean_utilization_percent;
  std::optional<int64_t> max_memory_used_bytes;
  /// Mean of the power readings; where there are none, the energy used over
  /// the time between the first and last sample with a counter.
  std::optional<double> mean_power_watts;
  /// Growth of the energy counter from the first to the last sample in the
  /// window; empty with fewer than two.
  std::optional<double> energy_joules;
};

/// Summarizes, per device in the order first seen, the samples whose
/// `time_s` lies in [`from_s`, `to_s`].
std::vector<SampleSummary> summarize(const std::vector<Sample>& samples, double from_s,
                                     double to_s);

/// Runs a `Sampler` in its own thread at an interval and keeps what it reads,
/// so that a trial can ask for the mean utilization between two times.
///
/// The thread starts with the monitor and is stopped and joined by its
/// destructor. An exception thrown in the thread (by the sampler or the
/// callback) ends the sampling and is rethrown to the caller by `stop()` or
/// `wait()`; the destructor drops it.
///
/// Example:
/// ```
///   batchtune::Monitor monitor(batchtune::make_sampler(device));
///   const double t0 = monitor.now_s();
///   auto result = runner.run(batchtune::TrialOptions().batch_size(256));
///   const double t1 = monitor.now_s();
///   monitor.stop();
///   for (const auto& s : monitor.summarize(t0, t1)) {
///     if (s.mean_utilization_percent) std::cout << s.device << " " << *s.mean_utilization_percent;
///   }
/// ```
class Monitor {
 public:
  /// Starts sampling. `clock` times the rounds and `now_s()`; give it the
  /// clock the sampler stamps its samples with.
  explicit Monitor(std::unique_ptr<Sampler> sampler, MonitorOptions options = {},
                   Clock& clock = steady_clock());
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  /// Stops sampling and joins the thread; rethrows, once, an exception the
  /// thread ended with. Calling it again does nothing.
  void stop();
  /// Waits until the thread ends by itself: after `rounds()` rounds, or when
  /// the sampler throws (rethrown here). With no round limit and a sampler
  /// that never fails, this waits for ever.
  void wait();

  /// The current time on the monitor's clock, for `summarize`.
  double now_s() const { return clock_.now_s(); }
  /// Every sample kept so far, oldest first.
  std::vector<Sample> samples() const;
  /// Per device, the samples taken between `from_s` and `to_s`.
  std::vector<SampleSummary> summarize(double from_s, double to_s) const;
  /// Rounds taken so far.
  int64_t rounds() const;
  const Sampler& sampler() const { return *sampler_; }
  const MonitorOptions& options() const { return options_; }

 private:
  void run();
  void join_and_rethrow();

  std::unique_ptr<Sampler> sampler_;
  MonitorOptions options_;
  Clock& clock_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_requested_ = false;
  int64_t rounds_ = 0;
  std::vector<Sample> samples_;
  std::exception_ptr error_;
  std::thread thread_;  // last: it starts once everything above exists
};

}  // namespace batchtune
