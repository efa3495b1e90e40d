#include "batchtune/common/clock.h"

#include <chrono>

namespace batchtune {

double SteadyClock::now_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool SteadyClock::wait_until(double deadline_s, std::condition_variable& wake,
                             std::unique_lock<std::mutex>& lock,
                             const std::function<bool()>& stop) {
  const auto deadline = std::chrono::steady_clock::time_point(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(deadline_s)));
  return wake.wait_until(lock, deadline, stop);
}

Clock& steady_clock() {
  static SteadyClock clock;
  return clock;
}

}  // namespace batchtune
