#pragma once

#include <algorithm>

#include "batchtune/common/clock.h"

namespace batchtune {

/// The time budget of a tune, phase by phase: each phase gets its share of
/// the whole plus what the phases before it left unused.
class Budget {
 public:
  Budget(const Clock& clock, double total_s) : clock_(clock), total_s_(total_s) {
    start_s_ = clock_.now_s();
  }
  /// Seconds phase `share` may spend from now.
  double begin_phase(double share) {
    phase_start_s_ = clock_.now_s();
    granted_s_ += share * total_s_;
    return std::max(0.0, start_s_ + granted_s_ - phase_start_s_);
  }
  bool phase_over() const { return clock_.now_s() >= start_s_ + granted_s_; }
  double phase_seconds() const { return clock_.now_s() - phase_start_s_; }
  double elapsed_s() const { return clock_.now_s() - start_s_; }

 private:
  const Clock& clock_;
  double total_s_;
  double start_s_ = 0;
  double phase_start_s_ = 0;
  double granted_s_ = 0;
};

}  // namespace batchtune
