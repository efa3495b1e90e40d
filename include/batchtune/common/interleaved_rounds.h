#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>

#include "batchtune/common/clock.h"

namespace batchtune {

/// What a trial of a round says of its contender.
enum class RoundTrial {
  kKeep,  ///< measured: in the next round again
  kDrop,  ///< left out of the rounds that follow (it did not fit, or no time was left for it)
  kStop,  ///< the rounds end now (the caller starts over, or has seen enough)
};

/// How `run_interleaved_rounds` spends its time.
struct RoundsOptions {
  /// Null for the steady clock.
  const Clock* clock = nullptr;
  /// The end of the caller's share of the time budget: the first round
  /// always runs; a later one only when the longest round so far would end
  /// by it.
  double deadline_s = std::numeric_limits<double>::infinity();
  /// Each trial's slice is what is left until the deadline over the trials
  /// still to run until this many rounds have run (at least the rest of its
  /// own round).
  int64_t min_rounds = 1;
  int64_t max_rounds = 1;
};

/// What the rounds did.
struct RoundsOutcome {
  /// Rounds started (a round a trial stopped counts).
  int64_t rounds = 0;
  /// Seconds the first round took, and how far it ran past the deadline
  /// alone (0: it ended by it).
  double first_round_s = 0;
  double overrun_s = 0;
  /// A round was not started: the longest so far would have ended past the deadline.
  bool out_of_time = false;
  /// A trial said `RoundTrial::kStop`.
  bool stopped = false;
};

/// Interleaved rounds of trials: each round runs one trial of every
/// contender still in, in turn, so that load that comes and goes falls on
/// all of them alike rather than on the one timed while it lasted (the
/// precision's fp32 against bf16, the sweep's batch sizes).
/// `trial(contender, slice_s)` runs one trial of contender `contender`
/// (from 0) within `slice_s` seconds. `settled` (may be empty) is asked
/// before every round and ends them when true (a decision reached, a stop
/// requested). Rounds end at `max_rounds`, when no contender is left, or
/// when the next round is expected to outlast the deadline: rounds are
/// sized to the caller's share, and only a first round that alone outlasts
/// it runs over (`RoundsOutcome::overrun_s` says by how much).
///
/// Example:
/// ```
///   batchtune::RoundsOptions options;
///   options.deadline_s = clock.now_s() + 2;
///   options.min_rounds = options.max_rounds = 3;
///   run_interleaved_rounds(sizes.size(), [&](size_t i, double slice_s) {
///     time(sizes[i], slice_s);
///     return batchtune::RoundTrial::kKeep;
///   }, {}, options);
/// ```
RoundsOutcome run_interleaved_rounds(size_t contenders,
                                     const std::function<RoundTrial(size_t, double)>& trial,
                                     const std::function<bool()>& settled,
                                     const RoundsOptions& options);

}  // namespace batchtune
