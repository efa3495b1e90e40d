#pragma once

// A hang guard: ends what a test waits for when it is still running long
// after it should have ended by itself. Not a measurement: a test that
// passes never comes near it, and no test asserts how long anything took.

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace batchtune::testing {

class HangGuard {
 public:
  /// After `seconds` (real time) still alive: SIGKILL to `pid`, or with no
  /// pid, this test process ends with exit code 124 naming `what`.
  HangGuard(int seconds, std::string what, pid_t pid = 0)
      : thread_([this, seconds, what = std::move(what), pid] {
          std::unique_lock<std::mutex> lock(mutex_);
          if (done_cv_.wait_for(lock, std::chrono::seconds(seconds), [this] { return done_; })) {
            return;
          }
          std::fprintf(stderr, "hang guard: %s still running after %d s\n", what.c_str(),
                       seconds);
          if (pid > 0) {
            ::kill(pid, SIGKILL);
          } else {
            std::_Exit(124);
          }
        }) {}
  ~HangGuard() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }
  HangGuard(const HangGuard&) = delete;
  HangGuard& operator=(const HangGuard&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;  // last: it starts once everything above exists
};

}  // namespace batchtune::testing
