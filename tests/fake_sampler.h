#pragma once

// A sampler that reads made-up devices: round i returns `script[i]` (the
// last entry repeated after the end), stamped with the clock's time, and
// throws at a chosen round.

#include <atomic>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "batchtune/monitoring/sampler.h"

namespace batchtune::testing {

class FakeSampler final : public Sampler {
 public:
  /// Seen by the test after the monitor has taken the sampler.
  struct Record {
    std::atomic<int64_t> reads{0};
    std::atomic<bool> destroyed{false};
  };

  FakeSampler(Clock& clock, std::vector<std::vector<Sample>> script,
              std::shared_ptr<Record> record = std::make_shared<Record>(),
              std::optional<int64_t> throw_at_read = std::nullopt, std::string reason = {})
      : clock_(clock),
        script_(std::move(script)),
        record_(std::move(record)),
        throw_at_read_(throw_at_read),
        reason_(std::move(reason)) {}

  ~FakeSampler() override { record_->destroyed = true; }

  std::vector<Sample> read() override {
    const int64_t index = record_->reads++;
    if (throw_at_read_ && index == *throw_at_read_) {
      throw std::runtime_error("fake sampler: the device went away");
    }
    auto samples = script_.at(std::min<size_t>(static_cast<size_t>(index), script_.size() - 1));
    for (auto& s : samples) s.time_s = clock_.now_s();
    return samples;
  }

  std::string describe() const override { return "fake"; }
  std::string unavailable_reason() const override { return reason_; }

 private:
  Clock& clock_;
  std::vector<std::vector<Sample>> script_;
  std::shared_ptr<Record> record_;
  std::optional<int64_t> throw_at_read_;
  std::string reason_;
};

/// A sample of `device` with utilization `percent` and the other fields given.
inline Sample make_sample(const std::string& device, std::optional<double> percent,
                          std::optional<int64_t> memory = std::nullopt,
                          std::optional<double> power = std::nullopt,
                          std::optional<double> energy = std::nullopt) {
  Sample s;
  s.device = device;
  s.utilization_percent = percent;
  s.memory_used_bytes = memory;
  s.power_watts = power;
  s.energy_joules = energy;
  return s;
}

}  // namespace batchtune::testing
