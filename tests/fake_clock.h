#pragma once

// A clock that moves only when waited on: timing logic runs exactly and at
// once in tests.

#include <atomic>

#include "batchtune/common/clock.h"

namespace batchtune::testing {

class FakeClock final : public Clock {
 public:
  explicit FakeClock(double start_s = 0) : now_s_(start_s) {}

  double now_s() const override { return now_s_.load(); }

  /// Jumps to the deadline at once, unless already told to stop.
  bool wait_until(double deadline_s, std::condition_variable&, std::unique_lock<std::mutex>&,
                  const std::function<bool()>& stop) override {
    if (stop()) return true;
    if (deadline_s > now_s_.load()) now_s_.store(deadline_s);
    return false;
  }

  void advance(double seconds) { now_s_.store(now_s_.load() + seconds); }

 private:
  std::atomic<double> now_s_;
};

}  // namespace batchtune::testing
