#include "batchtune/step/lockstep.h"

#include <fmt/format.h>

#include <algorithm>

#include "batchtune/step/trial.h"

namespace batchtune {
namespace {

const char* failure_words(TrialFailure failure) {
  switch (failure) {
    case TrialFailure::kOutOfMemory:
      return "ran out of memory";
    case TrialFailure::kOverBudget:
      return "peaked over its usable memory";
    case TrialFailure::kDoesNotRun:
      return "could not run the size";
    case TrialFailure::kNone:
      break;
  }
  return "did not fit";
}

}  // namespace

void Lockstep::begin_trial(int64_t batch_size) {
  batch_size_ = batch_size;
  failure_agreed_ = false;
}

std::pair<bool, bool> Lockstep::meet(bool wanted, bool out_of_memory, bool error) {
  const std::vector<double> m = ranks_.max_over_ranks(
      {wanted ? 1.0 : 0.0, wanted ? 0.0 : 1.0, out_of_memory ? 1.0 : 0.0, error ? 1.0 : 0.0});
  if (m[2] > 0 || m[3] > 0) {
    failure_agreed_ = true;
    if (m[3] > 0) {
      error_agreed_ = true;
      throw PeerFailure(fmt::format("batch {}: another rank stopped with an error (its own "
                                    "output says which)",
                                    batch_size_),
                        false);
    }
    throw PeerFailure(fmt::format("another rank ran out of memory at batch {}", batch_size_),
                      true);
  }
  return {m[0] > 0, m[1] == 0};
}

bool Lockstep::another_step(bool wanted, bool any) {
  const auto [some, all] = meet(wanted, false, false);
  return any ? some : all;
}

bool Lockstep::check_peers() {
  try {
    meet(false, false, false);
    return true;
  } catch (const PeerFailure& e) {
    if (!e.out_of_memory) throw;  // a peer's error stops this rank too
    return false;
  }
}

void Lockstep::check_between_trials() {
  try {
    meet(false, false, false);
  } catch (const PeerFailure& e) {
    if (e.out_of_memory) throw;  // none is sent between trials; kept as it came
    throw PeerFailure("another rank stopped with an error (its own output says which)", false);
  }
}

void Lockstep::fail(bool error) {
  if (error ? error_agreed_ : failure_agreed_) return;
  try {
    meet(false, !error, error);
  } catch (const PeerFailure&) {
    // Ours, and perhaps a peer's: agreed either way.
  }
}

void Lockstep::agree(TrialResult& r) {
  check_between_trials();
  const auto steps = static_cast<double>(r.step_seconds.size());
  const std::vector<double> m = ranks_.max_over_ranks(
      {r.fits ? 0.0 : 1.0, static_cast<double>(static_cast<int>(r.failure)),
       static_cast<double>(r.peak_bytes), -static_cast<double>(r.capacity_bytes),
       -static_cast<double>(r.usable_bytes), steps, -steps});
  if (r.fits && m[0] > 0) {
    r.fits = false;
    r.failure = static_cast<TrialFailure>(static_cast<int>(m[1]));
    r.error = fmt::format("another rank {} at batch {}", failure_words(r.failure),
                          r.batch_size);
  }
  r.peak_bytes = static_cast<int64_t>(m[2]);
  r.capacity_bytes = static_cast<int64_t>(-m[3]);
  r.usable_bytes = static_cast<int64_t>(-m[4]);
  // The same steps on every rank (they ran in lockstep): each the slowest
  // rank's. Where the counts differ (a failed trial) each keeps its own.
  if (m[5] == -m[6] && !r.step_seconds.empty()) {
    std::vector<double> times = r.step_seconds;
    times.insert(times.end(), r.wait_seconds.begin(), r.wait_seconds.end());
    times = ranks_.max_over_ranks(times);
    r.step_seconds.assign(times.begin(), times.begin() + r.step_seconds.size());
    r.wait_seconds.assign(times.begin() + r.step_seconds.size(), times.end());
  }
}

double Lockstep::agree_seconds(double seconds) {
  check_between_trials();
  return ranks_.max_over_ranks({seconds})[0];
}

}  // namespace batchtune
