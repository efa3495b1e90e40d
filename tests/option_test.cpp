#include "batchtune/common/option.h"

#include <gtest/gtest.h>

namespace batchtune {
namespace {

TEST(OptionError, EachFrontEndNamesTheOptionItsOwnWay) {
  const OptionError error(Option::kMemoryLimit,
                          "too small; give a larger " + mention(Option::kMemoryLimit) +
                              " or a smaller " + mention(Option::kMargin));
  EXPECT_EQ(error.option(), Option::kMemoryLimit);
  EXPECT_STREQ(error.what(),
               "--memory-limit: too small; give a larger --memory-limit or a smaller --margin");
  EXPECT_EQ(error.message(FrontEnd::kCli), error.what());
  EXPECT_EQ(error.message(FrontEnd::kPython),
            "memory_limit: too small; give a larger memory_limit or a smaller margin");
}

TEST(OptionError, NamesDifferWhereTheFrontEndsDo) {
  EXPECT_EQ(option_name(Option::kWarmup, FrontEnd::kCli), "--warmup");
  EXPECT_EQ(option_name(Option::kWarmup, FrontEnd::kPython), "warmup_steps");
  EXPECT_EQ(option_name(Option::kSearchTolerance, FrontEnd::kCli), "--search-tolerance");
  EXPECT_EQ(option_name(Option::kTimeBudget, FrontEnd::kPython), "time_budget");
}

TEST(OptionError, TextWithoutMentionsIsKept) {
  EXPECT_EQ(name_options("as it is, 0.5 s", FrontEnd::kPython), "as it is, 0.5 s");
  EXPECT_EQ(name_options("", FrontEnd::kCli), "");
}

}  // namespace
}  // namespace batchtune
