#include "batchtune/common/interleaved_rounds.h"

#include <gtest/gtest.h>

#include <vector>

#include "fake_clock.h"

namespace batchtune {
namespace {

TEST(InterleavedRounds, EachRoundRunsEveryContenderStillInInTurn) {
  testing::FakeClock clock;
  std::vector<size_t> order;
  RoundsOptions options;
  options.clock = &clock;
  options.min_rounds = options.max_rounds = 3;
  const RoundsOutcome out = run_interleaved_rounds(
      3,
      [&](size_t i, double) {
        order.push_back(i);
        clock.advance(1);
        // Contender 1 drops out after its first trial (it did not fit).
        return i == 1 ? RoundTrial::kDrop : RoundTrial::kKeep;
      },
      {}, options);
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 0, 2, 0, 2}));
  EXPECT_EQ(out.rounds, 3);
  EXPECT_FALSE(out.out_of_time);
  EXPECT_EQ(out.overrun_s, 0);
}

TEST(InterleavedRounds, SlicesShareWhatIsLeftAmongTheTrialsStillToRun) {
  testing::FakeClock clock;
  std::vector<double> slices;
  RoundsOptions options;
  options.clock = &clock;
  options.deadline_s = 12;
  options.min_rounds = options.max_rounds = 3;
  run_interleaved_rounds(
      2,
      [&](size_t, double slice) {
        slices.push_back(slice);
        clock.advance(slice);
        return RoundTrial::kKeep;
      },
      {}, options);
  EXPECT_EQ(slices, (std::vector<double>{2, 2, 2, 2, 2, 2}));
}

TEST(InterleavedRounds, ARoundExpectedToOutlastTheDeadlineIsNotStarted) {
  testing::FakeClock clock;
  RoundsOptions options;
  options.clock = &clock;
  options.deadline_s = 2;
  options.min_rounds = options.max_rounds = 12;
  // Trials of 0.3 s: a round of two takes 0.6 s; three fit in 2 s, a fourth would not.
  int trials = 0;
  const RoundsOutcome out = run_interleaved_rounds(
      2,
      [&](size_t, double) {
        ++trials;
        clock.advance(0.3);
        return RoundTrial::kKeep;
      },
      {}, options);
  EXPECT_EQ(out.rounds, 3);
  EXPECT_EQ(trials, 6);
  EXPECT_TRUE(out.out_of_time);
  EXPECT_LE(clock.now_s(), options.deadline_s);
  EXPECT_EQ(out.overrun_s, 0);
}

TEST(InterleavedRounds, AFirstRoundThatAloneOutlastsTheDeadlineRunsAndSaysByHowMuch) {
  testing::FakeClock clock;
  RoundsOptions options;
  options.clock = &clock;
  options.deadline_s = 2;
  options.min_rounds = options.max_rounds = 6;
  const RoundsOutcome out = run_interleaved_rounds(
      2,
      [&](size_t, double) {
        clock.advance(2);
        return RoundTrial::kKeep;
      },
      {}, options);
  EXPECT_EQ(out.rounds, 1);
  EXPECT_DOUBLE_EQ(out.first_round_s, 4);
  EXPECT_DOUBLE_EQ(out.overrun_s, 2);
  EXPECT_TRUE(out.out_of_time);
}

TEST(InterleavedRounds, ASettledDecisionOrAStopEndsTheRounds) {
  testing::FakeClock clock;
  RoundsOptions options;
  options.clock = &clock;
  options.max_rounds = 10;
  int trials = 0;
  RoundsOutcome out = run_interleaved_rounds(
      2,
      [&](size_t, double) {
        ++trials;
        return RoundTrial::kKeep;
      },
      [&] { return trials >= 4; }, options);
  EXPECT_EQ(out.rounds, 2);
  trials = 0;
  out = run_interleaved_rounds(
      2,
      [&](size_t i, double) {
        ++trials;
        return i == 0 ? RoundTrial::kStop : RoundTrial::kKeep;
      },
      {}, options);
  EXPECT_TRUE(out.stopped);
  EXPECT_EQ(trials, 1) << "the round ends at the stop";
}

}  // namespace
}  // namespace batchtune
