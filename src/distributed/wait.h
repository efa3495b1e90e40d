#pragma once

// The waits of a rank and of the launcher, on a `Clock` so that tests run
// them on a fake one: exactly, and at once.

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>

#include "batchtune/common/clock.h"
#include "batchtune/common/interrupt.h"

namespace batchtune {

/// Waits on `clock` until `done()` holds (read under `lock`, woken through
/// `wake`) or until `deadline_s`, looking for an interrupt request at least
/// every `poll_s` (a signal handler cannot notify `wake`). Returns true when
/// done, false at the deadline; throws `Interrupted` at an interrupt.
inline bool wait_polling_interrupts(Clock& clock, double deadline_s, double poll_s,
                                    std::condition_variable& wake,
                                    std::unique_lock<std::mutex>& lock,
                                    const std::function<bool()>& done) {
  while (!done()) {
    if (interrupt_requested()) throw Interrupted();
    const double now_s = clock.now_s();
    if (now_s >= deadline_s) return false;
    clock.wait_until(std::min(deadline_s, now_s + poll_s), wake, lock, done);
  }
  return true;
}

/// Sleeps `seconds` on `clock` (a fake one returns at once, moved on).
inline void sleep_on(Clock& clock, double seconds) {
  std::mutex mutex;
  std::condition_variable never;
  std::unique_lock<std::mutex> lock(mutex);
  clock.wait_until(clock.now_s() + seconds, never, lock, [] { return false; });
}

}  // namespace batchtune
