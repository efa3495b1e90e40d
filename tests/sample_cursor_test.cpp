#include "batchtune/data/sample_cursor.h"

#include <gtest/gtest.h>

#include <set>

namespace batchtune {
namespace {

TEST(SampleCursor, AFixedBatchWalksEpochsAsStepsOverStepsPerEpoch) {
  SampleCursor cursor(100, 32);  // 3 steps an epoch, 4 samples dropped
  for (int64_t step = 0; step < 10; ++step) {
    EXPECT_EQ(cursor.at(step).epoch, step / 3) << step;
    EXPECT_EQ(cursor.at(step).offset, (step % 3) * 32) << step;
  }
  EXPECT_EQ(cursor.first_step_of(2), 6);
}

TEST(SampleCursor, AChangeTakesTheNextSamplesOfTheSameEpoch) {
  SampleCursor cursor(1000, 64);  // 15 steps an epoch at 64
  cursor.change(10, 128);
  EXPECT_EQ(cursor.at(9).offset, 576);
  EXPECT_EQ(cursor.at(10).offset, 640) << "right after the samples of step 9";
  EXPECT_EQ(cursor.at(11).offset, 768);
  EXPECT_EQ(cursor.at(12).epoch, 1) << "104 samples left: not a batch of 128";
  EXPECT_EQ(cursor.at(12).offset, 0);
  EXPECT_EQ(cursor.global_batch(9), 64);
  EXPECT_EQ(cursor.global_batch(12), 128);
  EXPECT_EQ(cursor.first_step_of(2), 12 + 1000 / 128);
}

TEST(SampleCursor, NoSampleIsTakenTwiceInAnEpochThroughChanges) {
  SampleCursor cursor(1000, 16);
  cursor.change(5, 64);
  cursor.change(9, 32);
  cursor.change(12, 128);
  std::set<int64_t> taken;
  for (int64_t step = 0; cursor.at(step).epoch == 0; ++step) {
    const SamplePosition p = cursor.at(step);
    for (int64_t i = p.offset; i < p.offset + cursor.global_batch(step); ++i) {
      EXPECT_TRUE(taken.insert(i).second) << "sample slot " << i << " again at step " << step;
    }
  }
  // 5 x 16 + 4 x 64 + 3 x 32 = 432, then 4 x 128 = 512: 944 taken, 56 dropped.
  EXPECT_EQ(taken.size(), 944u);
}

TEST(SampleCursor, AChangeWhereTheEpochHasTooFewLeftStartsTheNextEpoch) {
  SampleCursor cursor(100, 30);
  cursor.change(3, 20);  // 10 left after 3 x 30
  EXPECT_EQ(cursor.at(3).epoch, 1);
  EXPECT_EQ(cursor.at(3).offset, 0);
  EXPECT_EQ(cursor.first_step_of(1), 3);
}

}  // namespace
}  // namespace batchtune
