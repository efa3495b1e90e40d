#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace batchtune {

struct TrialResult;

/// The ranks a trial meets: an element-wise maximum over every rank of the
/// group (an all-reduce), in `tuning/` over the tune's `Communicator`.
class RankMaximum {
 public:
  virtual ~RankMaximum() = default;
  /// `values` replaced by their maximum over the ranks, element by element.
  /// Every rank calls it with as many values, in the same order.
  virtual std::vector<double> max_over_ranks(const std::vector<double>& values) = 0;
};

/// A peer's failure learned at a meeting: the trial ends on this rank too,
/// as an out-of-memory (`out_of_memory`) or by the peer's error.
class PeerFailure : public std::runtime_error {
 public:
  PeerFailure(const std::string& what, bool out_of_memory)
      : std::runtime_error(what), out_of_memory(out_of_memory) {}
  bool out_of_memory;
};

/// Trials in lockstep, for a step that communicates (a data-parallel
/// model's gradient average, a sharded model's gathers): every rank runs
/// the same steps, and a failure on one rank is known to every rank at its
/// next meeting, before any rank starts a collective its peer will not.
///
/// The runner meets the ranks after `prepare` and after every step (whether
/// to run another: warm-up while any rank wants one, timed steps while all
/// do); the subject may meet them inside its step (`check_peers`, before its
/// own collectives). A rank whose step failed meets them once with the
/// failure (`fail`) instead of its next meeting, so every rank calls the
/// same number of meetings; a failure already agreed is not sent again.
/// Between trials every collective of the ranks begins with a meeting too
/// (`check_between_trials`: before the result's agreement, the agreed
/// clock, a phase's agreement over the group), so that a rank stopped by an
/// error anywhere — saving the subject, putting it back, a reporter, a
/// decision — tells its peers once (`fail(true)`) at whatever point they
/// wait, and no rank is left in a collective another never joins.
/// After the trial the ranks take one result (`agree`): it fits where it
/// fits on every rank, its peak is the largest, its capacity the smallest,
/// its step times the slowest rank's (the step is as slow as its slowest
/// rank) — so that every decision taken from it is the same on every rank.
///
/// Example:
/// ```
///   batchtune::Lockstep lockstep(ranks);  // a RankMaximum over the group
///   runner.set_lockstep(&lockstep);       // every rank, before its trials
/// ```
class Lockstep {
 public:
  explicit Lockstep(RankMaximum& ranks) : ranks_(ranks) {}

  /// A new trial at `batch_size`: no failure agreed yet.
  void begin_trial(int64_t batch_size);
  /// Whether the ranks run another step: `any` — while any rank wants one
  /// (warm-up); else while all do (timed steps). Throws `PeerFailure` when
  /// a peer failed.
  bool another_step(bool wanted, bool any);
  /// Inside a step, before its collectives: false when a peer ran out of
  /// memory (the step must then stop, as an out-of-memory does); throws
  /// `PeerFailure` when a peer stopped with an error.
  bool check_peers();
  /// Between trials, before a collective of the ranks: throws
  /// `PeerFailure` when a peer stopped with an error.
  void check_between_trials();
  /// This rank's step failed: tells the others at their next meeting,
  /// unless the failure was learned from them. `error`: not an
  /// out-of-memory (the peers stop too); an error is sent once for the
  /// whole tune, wherever it happens, unless a peer's was learned.
  void fail(bool error);
  bool failure_agreed() const { return failure_agreed_; }
  /// Whether an error stopped this rank or a peer and every rank knows.
  bool error_agreed() const { return error_agreed_; }
  /// The trial's result taken together with the peers' (see above),
  /// after a meeting.
  void agree(TrialResult& result);
  /// The largest of the ranks' `seconds`, after a meeting.
  double agree_seconds(double seconds);

 private:
  /// One meeting: this rank's wish and failure; throws `PeerFailure` when
  /// a peer failed. Returns (any rank wants more, every rank wants more).
  std::pair<bool, bool> meet(bool wanted, bool out_of_memory, bool error);

  RankMaximum& ranks_;
  int64_t batch_size_ = 0;
  bool failure_agreed_ = false;  ///< this trial's failure, by this rank or a peer
  bool error_agreed_ = false;    ///< an error, for the rest of the tune
};

}  // namespace batchtune
