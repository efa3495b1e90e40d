#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>

namespace batchtune {

/// Time for code that measures or waits at intervals: the real steady clock,
/// or a fake one in tests, so that timing logic runs exactly and at once.
///
/// Example:
/// ```
///   batchtune::Clock& clock = batchtune::steady_clock();
///   const double start = clock.now_s();
///   run_something();
///   std::cout << clock.now_s() - start << " s\n";
/// ```
class Clock {
 public:
  virtual ~Clock() = default;

  /// Seconds since a fixed, arbitrary point. Never goes back.
  virtual double now_s() const = 0;

  /// Waits until `now_s() >= deadline_s`, or until `wake` is notified and
  /// `stop()` holds, whichever comes first. `lock` holds the mutex that
  /// guards what `stop` reads. Returns `stop()`.
  virtual bool wait_until(double deadline_s, std::condition_variable& wake,
                          std::unique_lock<std::mutex>& lock,
                          const std::function<bool()>& stop) = 0;
};

/// `std::chrono::steady_clock`.
class SteadyClock final : public Clock {
 public:
  double now_s() const override;
  bool wait_until(double deadline_s, std::condition_variable& wake,
                  std::unique_lock<std::mutex>& lock,
                  const std::function<bool()>& stop) override;
};

/// The process's one `SteadyClock`, the default wherever a clock is taken.
Clock& steady_clock();

/// The clock an options struct names, null for `steady_clock()`; an alias
/// so that `TORCH_ARG(ClockPointer, clock) = nullptr;` declares it.
using ClockPointer = Clock*;
/// A clock that is only read, as `TORCH_ARG` takes it: one type name.
using ConstClockPointer = const Clock*;

}  // namespace batchtune
