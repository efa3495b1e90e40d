#pragma once

// A clock that moves only when waited on: timing logic runs exactly and at
// once in tests.

#include <atomic>
#include <mutex>
#include <vector>

#include "batchtune/common/clock.h"

namespace batchtune::testing {

class FakeClock final : public Clock {
 public:
  explicit FakeClock(double start_s = 0) : now_s_(start_s) {}

  double now_s() const override { return now_s_.load(); }

  /// Jumps to the deadline at once, unless already told to stop. A held
  /// clock (`hold()`) instead waits on `wake` until `stop()` holds, without
  /// moving: a deadline is never reached, only a wake-up ends the wait.
  bool wait_until(double deadline_s, std::condition_variable& wake,
                  std::unique_lock<std::mutex>& lock,
                  const std::function<bool()>& stop) override {
    {
      std::lock_guard<std::mutex> guard(deadlines_mutex_);
      deadlines_.push_back(deadline_s);
    }
    if (held_.load()) {
      ++holding_;
      wake.wait(lock, stop);
      --holding_;
      return true;
    }
    if (stop()) return true;
    if (deadline_s > now_s_.load()) now_s_.store(deadline_s);
    return false;
  }

  void advance(double seconds) { now_s_.store(now_s_.load() + seconds); }

  /// From now on a wait never reaches its deadline (see `wait_until`).
  void hold() { held_ = true; }
  /// Waits in progress on a held clock.
  int holding() const { return holding_.load(); }
  /// Every deadline waited for so far, in order.
  std::vector<double> deadlines() const {
    std::lock_guard<std::mutex> guard(deadlines_mutex_);
    return deadlines_;
  }

 private:
  std::atomic<double> now_s_;
  std::atomic<bool> held_{false};
  std::atomic<int> holding_{0};
  mutable std::mutex deadlines_mutex_;
  std::vector<double> deadlines_;
};

}  // namespace batchtune::testing
