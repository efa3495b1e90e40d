#pragma once

#include <algorithm>

#include "batchtune/common/clock.h"
#include "batchtune/step/lockstep.h"

namespace batchtune {

/// The time the phases decide by. Alone, the real clock. Several ranks in
/// lockstep (see `Lockstep`) must stop a phase at the same trial, so there
/// it is time agreed after each trial: the ranks' largest seconds since
/// the tune began, standing still in between.
class DecisionClock final : public Clock {
 public:
  DecisionClock(const Clock& real, Lockstep* lockstep)
      : real_(real), lockstep_(lockstep), start_s_(real.now_s()) {}
  double now_s() const override { return lockstep_ != nullptr ? agreed_s_ : real_.now_s(); }
  bool wait_until(double deadline_s, std::condition_variable& wake,
                  std::unique_lock<std::mutex>& lock,
                  const std::function<bool()>& stop) override {
    return const_cast<Clock&>(real_).wait_until(deadline_s, wake, lock, stop);
  }
  /// After a trial: the ranks agree how far the tune has come.
  void agree() {
    if (lockstep_ != nullptr) agreed_s_ = lockstep_->agree_seconds(real_.now_s() - start_s_);
  }

 private:
  const Clock& real_;
  Lockstep* lockstep_;
  double start_s_;
  double agreed_s_ = 0;
};

/// The time budget of a tune, phase by phase: each phase gets its share of
/// the whole plus what the phases before it left unused.
class Budget {
 public:
  Budget(const Clock& clock, double total_s) : clock_(clock), total_s_(total_s) {
    start_s_ = clock_.now_s();
  }
  /// Seconds phase `share` may spend from now: the phases so far were
  /// granted their shares of the total, this one's included, and it gets
  /// what they left; but never less than its own share, so that a phase
  /// before it that ran over (a first round that alone outlasted its share)
  /// does not starve it: the overrun is carried to the run's end and said.
  double begin_phase(double share) {
    phase_start_s_ = clock_.now_s();
    granted_s_ += share * total_s_;
    const double seconds =
        std::max(share * total_s_, start_s_ + granted_s_ - phase_start_s_);
    phase_deadline_s_ = phase_start_s_ + seconds;
    return seconds;
  }
  bool phase_over() const { return clock_.now_s() >= phase_deadline_s_; }
  double phase_seconds() const { return clock_.now_s() - phase_start_s_; }
  double elapsed_s() const { return clock_.now_s() - start_s_; }

 private:
  const Clock& clock_;
  double total_s_;
  double start_s_ = 0;
  double phase_start_s_ = 0;
  double phase_deadline_s_ = 0;
  double granted_s_ = 0;
};

}  // namespace batchtune
