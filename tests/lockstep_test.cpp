// Trials in lockstep, one rank against a scripted peer: what the runner
// sends at each meeting, and what it makes of the peer's answers.
#include "batchtune/step/lockstep.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <vector>

#include "batchtune/common/error.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/trial.h"

namespace {

using namespace batchtune;

constexpr int64_t kMiB = 1 << 20;

/// The other rank: `answer(call, ours)` is its values at the `call`-th
/// collective (0-based); the group's answer is the element-wise maximum.
/// By default the peer is in step with us (it answers our own values).
class ScriptedPeer final : public RankMaximum {
 public:
  using Answer = std::function<std::vector<double>(size_t, const std::vector<double>&)>;
  explicit ScriptedPeer(Answer answer = nullptr) : answer_(std::move(answer)) {}
  std::vector<double> max_over_ranks(const std::vector<double>& ours) override {
    sent.push_back(ours);
    std::vector<double> theirs = answer_ ? answer_(sent.size() - 1, ours) : ours;
    for (size_t i = 0; i < ours.size(); ++i) theirs[i] = std::max(theirs[i], ours[i]);
    return theirs;
  }
  std::vector<std::vector<double>> sent;

 private:
  Answer answer_;
};

/// A meeting's values: (wants another step, its negation, out of memory, error).
std::vector<double> wants(bool more) { return {more ? 1.0 : 0.0, more ? 0.0 : 1.0, 0, 0}; }
const std::vector<double> kPeerOutOfMemory{0, 1, 1, 0};
const std::vector<double> kPeerError{0, 1, 0, 1};

/// Counts its steps; runs out of memory at step `oom_at` (1-based, 0: never).
class CountingSubject final : public TrialSubject {
 public:
  explicit CountingSubject(int oom_at = 0) : oom_at_(oom_at) {}
  std::string describe() const override { return "counting"; }
  void save() override {
    if (save_fails) throw std::runtime_error("the snapshot failed");
  }
  void prepare(int64_t) override {}
  at::Tensor step() override {
    ++steps;
    TORCH_CHECK_WITH(OutOfMemoryError, steps != oom_at_, "out of memory at step ", steps);
    return at::ones({});
  }
  void restore() override {
    ++restores;
    if (restore_fails) throw std::runtime_error("putting back failed");
  }
  int steps = 0;
  int restores = 0;
  bool save_fails = false;
  bool restore_fails = false;

 private:
  int oom_at_;
};

/// One trial of `subject` at batch 4 (one warm-up step, three timed) in
/// lockstep with `ranks`.
TrialResult trial_in_lockstep(ScriptedPeer& ranks, CountingSubject& subject) {
  Lockstep lockstep(ranks);
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  TrialRunner runner(subject, *memory);
  runner.set_lockstep(&lockstep);
  return runner.run(TrialOptions().batch_size(4).warmup_steps(1).steps(3));
}

TEST(Lockstep, WarmUpGoesOnWhileAnyRankWantsAndTimedStepsWhileAllDo) {
  // The peer wants three warm-up steps (we want one), and two timed steps
  // (we want three).
  const std::vector<bool> peer{true, true, true, false, true, true, false};
  ScriptedPeer ranks([&](size_t call, const std::vector<double>& ours) {
    return call < peer.size() ? wants(peer[call]) : ours;
  });
  CountingSubject subject;
  const TrialResult r = trial_in_lockstep(ranks, subject);
  ASSERT_TRUE(r.fits) << r.error;
  EXPECT_EQ(r.warmup_steps_run, 3);
  EXPECT_EQ(r.step_seconds.size(), 2u);
  // A meeting before every step and after the last, then the result.
  EXPECT_EQ(ranks.sent.size(), peer.size() + 3);  // + a meeting, the result, its step times
  EXPECT_EQ(ranks.sent[3], wants(false));  // we wanted no second warm-up step
}

TEST(Lockstep, APeersOutOfMemoryEndsTheTrialHereAsOneAndIsNotSentBack) {
  ScriptedPeer ranks([](size_t call, const std::vector<double>& ours) {
    return call == 2 ? kPeerOutOfMemory : ours;
  });
  CountingSubject subject;
  const TrialResult r = trial_in_lockstep(ranks, subject);
  EXPECT_FALSE(r.fits);
  EXPECT_EQ(r.failure, TrialFailure::kOutOfMemory);
  EXPECT_EQ(r.error, "another rank ran out of memory at batch 4");
  EXPECT_EQ(subject.steps, 1);  // the warm-up step; the peer failed in its own
  EXPECT_EQ(subject.restores, 1);
  ASSERT_EQ(ranks.sent.size(), 5u);  // three meetings, then the result's (no failure sent)
  EXPECT_EQ(ranks.sent[3], wants(false));
  EXPECT_EQ(ranks.sent[4].size(), 7u);
}

TEST(Lockstep, AnOutOfMemoryHereIsSentOnceInsteadOfTheNextMeeting) {
  ScriptedPeer ranks;
  CountingSubject subject(/*oom_at=*/2);
  const TrialResult r = trial_in_lockstep(ranks, subject);
  EXPECT_FALSE(r.fits);
  EXPECT_EQ(r.failure, TrialFailure::kOutOfMemory);
  // Meetings before step 1, after it (warm-up done) and before step 2, the
  // failure in place of the one after step 2, then the result's.
  ASSERT_EQ(ranks.sent.size(), 6u);
  EXPECT_EQ(ranks.sent[3], kPeerOutOfMemory);
  EXPECT_EQ(ranks.sent[5].size(), 7u);
}

TEST(Lockstep, APeersErrorStopsThisRankWithAnErrorAndTheSubjectPutBack) {
  ScriptedPeer ranks([](size_t call, const std::vector<double>& ours) {
    return call == 1 ? kPeerError : ours;
  });
  CountingSubject subject;
  try {
    trial_in_lockstep(ranks, subject);
    FAIL() << "a peer's error must stop this rank";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "batch 4: another rank stopped with an error (its own output says which)");
  }
  EXPECT_EQ(subject.restores, 1);
  EXPECT_EQ(ranks.sent.size(), 2u);  // nothing sent after the error was agreed
}

TEST(Lockstep, InsideAStepCheckPeersSaysWhetherAPeerRanOutOfMemory) {
  ScriptedPeer ranks([](size_t call, const std::vector<double>& ours) {
    return call == 1 ? kPeerOutOfMemory : call == 2 ? kPeerError : ours;
  });
  Lockstep lockstep(ranks);
  lockstep.begin_trial(8);
  EXPECT_TRUE(lockstep.check_peers());
  EXPECT_FALSE(lockstep.failure_agreed());
  EXPECT_FALSE(lockstep.check_peers());
  EXPECT_TRUE(lockstep.failure_agreed());
  lockstep.fail(/*error=*/false);  // learned from the peer: not sent again
  EXPECT_EQ(ranks.sent.size(), 2u);
  lockstep.begin_trial(8);
  EXPECT_THROW(lockstep.check_peers(), PeerFailure);
}

TEST(Lockstep, TheRanksTakeOneResultFitsEverywherePeakLargestStepsSlowest) {
  TrialResult r;
  r.batch_size = 8;
  r.fits = true;
  r.peak_bytes = 100;
  r.capacity_bytes = 1000;
  r.usable_bytes = 900;
  r.step_seconds = {0.1, 0.3};
  r.wait_seconds = {0.0, 0.1};
  ScriptedPeer ranks([](size_t call, const std::vector<double>& ours) {
    if (call == 0) return ours;  // the meeting before it: no error anywhere
    if (call == 1) {  // over its budget, a larger peak, a smaller device, as many steps
      return std::vector<double>{1, static_cast<double>(TrialFailure::kOverBudget), 150, -800,
                                 -720, 2, -2};
    }
    return std::vector<double>{0.2, 0.2, 0.05, 0.0};
  });
  Lockstep lockstep(ranks);
  lockstep.agree(r);
  EXPECT_FALSE(r.fits);
  EXPECT_EQ(r.failure, TrialFailure::kOverBudget);
  EXPECT_EQ(r.error, "another rank peaked over its usable memory at batch 8");
  EXPECT_EQ(r.peak_bytes, 150);
  EXPECT_EQ(r.capacity_bytes, 800);
  EXPECT_EQ(r.usable_bytes, 720);
  EXPECT_EQ(r.step_seconds, (std::vector<double>{0.2, 0.3}));
  EXPECT_EQ(r.wait_seconds, (std::vector<double>{0.05, 0.1}));
}

TEST(Lockstep, AnErrorTakingTheSnapshotIsSentBeforeTheFirstMeeting) {
  ScriptedPeer ranks;
  CountingSubject subject;
  subject.save_fails = true;
  EXPECT_THROW(trial_in_lockstep(ranks, subject), std::runtime_error);
  // The peer, at the trial's first meeting, learns of it there.
  ASSERT_EQ(ranks.sent.size(), 1u);
  EXPECT_EQ(ranks.sent[0], kPeerError);
  EXPECT_EQ(subject.steps, 0);
}

TEST(Lockstep, AnErrorPuttingTheSubjectBackIsSentBeforeTheResult) {
  ScriptedPeer ranks;
  CountingSubject subject;
  subject.restore_fails = true;
  EXPECT_THROW(trial_in_lockstep(ranks, subject), std::runtime_error);
  // The trial's six meetings (it fitted), then the error where the peer
  // meets before taking the result; no result sent.
  ASSERT_EQ(ranks.sent.size(), 7u);
  EXPECT_EQ(ranks.sent[6], kPeerError);
}

TEST(Lockstep, APeersErrorBetweenTrialsStopsThisRankWhereItAgreesTheResult) {
  // The peer put its subject back and failed: its error meets our
  // meeting before the result.
  ScriptedPeer ranks([](size_t call, const std::vector<double>& ours) {
    return call == 6 ? kPeerError : ours;
  });
  CountingSubject subject;
  try {
    trial_in_lockstep(ranks, subject);
    FAIL() << "a peer's error must stop this rank";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "another rank stopped with an error (its own output says which)");
  }
  EXPECT_EQ(subject.restores, 1);
  EXPECT_EQ(ranks.sent.size(), 7u);  // nothing sent after it
}

TEST(Lockstep, AnErrorIsSentOnceForTheTuneEvenAfterAnAgreedOutOfMemory) {
  ScriptedPeer ranks([](size_t call, const std::vector<double>& ours) {
    return call == 0 ? kPeerOutOfMemory : ours;
  });
  Lockstep lockstep(ranks);
  lockstep.begin_trial(8);
  EXPECT_FALSE(lockstep.check_peers());  // the peer ran out of memory: agreed
  lockstep.fail(/*error=*/false);        // not sent back
  EXPECT_EQ(ranks.sent.size(), 1u);
  // Then this rank stops with an error before the next trial: sent, once.
  lockstep.fail(/*error=*/true);
  lockstep.fail(/*error=*/true);
  ASSERT_EQ(ranks.sent.size(), 2u);
  EXPECT_EQ(ranks.sent[1], kPeerError);
  EXPECT_TRUE(lockstep.error_agreed());
}

TEST(Lockstep, BetweenTrialsAMeetingPassesWhenNoRankFailedAndThrowsAPeersError) {
  ScriptedPeer ranks([](size_t call, const std::vector<double>& ours) {
    return call == 1 ? kPeerError : ours;
  });
  Lockstep lockstep(ranks);
  EXPECT_NO_THROW(lockstep.check_between_trials());
  try {
    lockstep.check_between_trials();
    FAIL() << "a peer's error must stop this rank";
  } catch (const PeerFailure& e) {
    EXPECT_FALSE(e.out_of_memory);
    EXPECT_STREQ(e.what(), "another rank stopped with an error (its own output says which)");
  }
  lockstep.fail(/*error=*/true);  // learned from the peer: not sent back
  EXPECT_EQ(ranks.sent.size(), 2u);
}

}  // namespace
