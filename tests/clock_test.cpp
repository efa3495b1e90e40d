#include "batchtune/common/clock.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

namespace batchtune {
namespace {

// The real clock's contract, on which every wait of the monitor, the
// rendezvous and the launcher rests. Only orders of readings are checked,
// never how long anything took.

TEST(SteadyClock, AWaitThatTimesOutEndsAtOrAfterItsDeadline) {
  Clock& clock = steady_clock();
  std::mutex mutex;
  std::condition_variable wake;
  std::unique_lock<std::mutex> lock(mutex);
  const double deadline_s = clock.now_s() + 0.01;
  EXPECT_FALSE(clock.wait_until(deadline_s, wake, lock, [] { return false; }));
  EXPECT_GE(clock.now_s(), deadline_s);
  EXPECT_TRUE(lock.owns_lock());
}

TEST(SteadyClock, AStopThatHoldsEndsTheWaitBeforeTheDeadline) {
  Clock& clock = steady_clock();
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::thread waker([&] {
    std::lock_guard<std::mutex> guard(mutex);
    stop = true;
    wake.notify_all();
  });
  std::unique_lock<std::mutex> lock(mutex);
  // A day away: only the wake-up can end this wait.
  const double deadline_s = clock.now_s() + 86400;
  EXPECT_TRUE(clock.wait_until(deadline_s, wake, lock, [&] { return stop; }));
  lock.unlock();
  waker.join();
}

TEST(SteadyClock, NeverGoesBack) {
  Clock& clock = steady_clock();
  double last = clock.now_s();
  for (int i = 0; i < 1000; ++i) {
    const double now = clock.now_s();
    EXPECT_GE(now, last);
    last = now;
  }
}

}  // namespace
}  // namespace batchtune
