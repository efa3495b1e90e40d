#include "batchtune/monitoring/monitor.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace batchtune {

std::vector<SampleSummary> summarize(const std::vector<Sample>& samples, double from_s,
                                     double to_s) {
  struct Accumulator {
    SampleSummary summary;
    double utilization_sum = 0;
    int64_t utilization_count = 0;
    double power_sum = 0;
    int64_t power_count = 0;
    std::optional<double> first_energy, last_energy;
    double first_energy_s = 0, last_energy_s = 0;
  };
  std::vector<Accumulator> devices;
  for (const auto& sample : samples) {
    if (sample.time_s < from_s || sample.time_s > to_s) continue;
    auto it = std::find_if(devices.begin(), devices.end(),
                           [&](const Accumulator& a) { return a.summary.device == sample.device; });
    if (it == devices.end()) {
      devices.emplace_back();
      devices.back().summary.device = sample.device;
      it = devices.end() - 1;
    }
    Accumulator& a = *it;
    ++a.summary.samples;
    if (sample.utilization_percent) {
      a.utilization_sum += *sample.utilization_percent;
      ++a.utilization_count;
    }
    if (sample.memory_used_bytes) {
      a.summary.max_memory_used_bytes =
          std::max(a.summary.max_memory_used_bytes.value_or(0), *sample.memory_used_bytes);
    }
    if (sample.power_watts) {
      a.power_sum += *sample.power_watts;
      ++a.power_count;
    }
    if (sample.energy_joules) {
      if (!a.first_energy) {
        a.first_energy = sample.energy_joules;
        a.first_energy_s = sample.time_s;
      }
      a.last_energy = sample.energy_joules;
      a.last_energy_s = sample.time_s;
    }
  }
  std::vector<SampleSummary> summaries;
  for (auto& a : devices) {
    if (a.utilization_count > 0) {
      a.summary.mean_utilization_percent = a.utilization_sum / a.utilization_count;
    }
    if (a.first_energy && a.last_energy_s > a.first_energy_s) {
      a.summary.energy_joules = *a.last_energy - *a.first_energy;
    }
    if (a.power_count > 0) {
      a.summary.mean_power_watts = a.power_sum / a.power_count;
    } else if (a.summary.energy_joules) {
      a.summary.mean_power_watts = *a.summary.energy_joules / (a.last_energy_s - a.first_energy_s);
    }
    summaries.push_back(std::move(a.summary));
  }
  return summaries;
}

Monitor::Monitor(std::unique_ptr<Sampler> sampler, MonitorOptions options, Clock& clock)
    : sampler_(std::move(sampler)), options_(std::move(options)), clock_(clock) {
  TORCH_CHECK(sampler_ != nullptr, "Monitor needs a sampler");
  TORCH_CHECK(options_.interval_ms() > 0, "Monitor interval must be positive, got ",
              options_.interval_ms(), " ms");
  thread_ = std::thread([this] { run(); });
}

Monitor::~Monitor() {
  try {
    stop();
  } catch (...) {  // NOLINT(bugprone-empty-catch): stop() is where callers see it
  }
}

void Monitor::run() {
  const double interval_s = options_.interval_ms() * 1e-3;
  try {
    double next_s = clock_.now_s() + interval_s;
    for (int64_t round = 0; options_.rounds() == 0 || round < options_.rounds(); ++round) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (clock_.wait_until(next_s, wake_, lock, [this] { return stop_requested_; })) return;
      }
      std::vector<Sample> taken = sampler_->read();
      if (options_.on_sample()) options_.on_sample()(taken);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++rounds_;
        if (options_.keep_samples()) {
          samples_.insert(samples_.end(), std::make_move_iterator(taken.begin()),
                          std::make_move_iterator(taken.end()));
        }
      }
      // Stay on the grid of intervals; a slow read skips the rounds it missed
      // rather than taking them back to back.
      next_s += interval_s;
      const double now_s = clock_.now_s();
      while (next_s < now_s) next_s += interval_s;
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::current_exception();
  }
}

void Monitor::join_and_rethrow() {
  if (thread_.joinable()) thread_.join();
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::swap(error, error_);
  }
  if (error) std::rethrow_exception(error);
}

void Monitor::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_requested_ = true;
  }
  wake_.notify_all();
  join_and_rethrow();
}

void Monitor::wait() { join_and_rethrow(); }

std::vector<Sample> Monitor::samples() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return samples_;
}

std::vector<SampleSummary> Monitor::summarize(double from_s, double to_s) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return batchtune::summarize(samples_, from_s, to_s);
}

int64_t Monitor::rounds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return rounds_;
}

}  // namespace batchtune
