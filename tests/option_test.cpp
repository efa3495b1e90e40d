#include "batchtune/common/option.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

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

TEST(OptionError, TheValueGivenFollowsTheOptionsName) {
  const OptionError error(Option::kModel, "net.pt",
                          "forward returned None; give " + mention(Option::kInput) +
                              " that it takes");
  EXPECT_EQ(error.option(), Option::kModel);
  EXPECT_EQ(error.value(), "net.pt");
  EXPECT_STREQ(error.what(), "--model net.pt: forward returned None; give --input that it takes");
  EXPECT_EQ(error.message(FrontEnd::kPython),
            "model net.pt: forward returned None; give make_batch that it takes");
  EXPECT_EQ(OptionError(Option::kData, "unknown data 'x'").value(), "");
}

TEST(OptionError, TheWorkloadIsNamedAsEachFrontEndTakesIt) {
  // The CLI builds the workload from flags; Python is handed its own.
  EXPECT_EQ(option_name(Option::kLoss, FrontEnd::kCli), "--loss");
  EXPECT_EQ(option_name(Option::kLoss, FrontEnd::kPython), "loss_fn");
  EXPECT_EQ(option_name(Option::kInput, FrontEnd::kPython), "make_batch");
  EXPECT_EQ(option_name(Option::kModel, FrontEnd::kPython), "model");
  EXPECT_EQ(option_name(Option::kAdaptMaxBatch, FrontEnd::kPython), "adapt_max_batch");
  EXPECT_EQ(option_name(Option::kNodeRank, FrontEnd::kCli), "--node-rank");
}

TEST(OptionError, TextWithoutMentionsIsKept) {
  EXPECT_EQ(name_options("as it is, 0.5 s", FrontEnd::kPython), "as it is, 0.5 s");
  EXPECT_EQ(name_options("", FrontEnd::kCli), "");
}

TEST(Option, EveryOptionHasADistinctNameInEachFrontEnd) {
  std::set<std::string> cli;
  std::set<std::string> python;
  for (int i = 0; i < kOptionCount; ++i) {
    const auto option = static_cast<Option>(i);
    const std::string flag = option_name(option, FrontEnd::kCli);
    const std::string argument = option_name(option, FrontEnd::kPython);
    EXPECT_EQ(flag.rfind("--", 0), 0u) << i << ": " << flag;
    EXPECT_GT(flag.size(), 2u) << i;
    EXPECT_FALSE(argument.empty()) << i;
    EXPECT_EQ(argument.find('-'), std::string::npos) << i << ": " << argument;
    EXPECT_TRUE(cli.insert(flag).second) << "two options are " << flag;
    EXPECT_TRUE(python.insert(argument).second) << "two options are " << argument;
    EXPECT_EQ(find_option(flag, FrontEnd::kCli), option) << flag;
    EXPECT_EQ(find_option(argument, FrontEnd::kPython), option) << argument;
  }
  EXPECT_EQ(find_option("--no-such-flag", FrontEnd::kCli), std::nullopt);
  EXPECT_EQ(find_option("--warmup", FrontEnd::kPython), std::nullopt);
}

TEST(Option, AnOptionWithoutANameFailsLoudly) {
  EXPECT_THROW(option_name(static_cast<Option>(kOptionCount), FrontEnd::kCli), c10::Error);
}

TEST(Option, ASourceSaysWhereAValueCameFrom) {
  const OptionSources sources{{Option::kBaseLr, "the optimizer's lr"}};
  EXPECT_EQ(option_source(Option::kBaseLr, FrontEnd::kPython, sources), "the optimizer's lr");
  EXPECT_EQ(option_source(Option::kBaseBatch, FrontEnd::kPython, sources), "base_batch");
  EXPECT_EQ(option_source(Option::kWarmup, FrontEnd::kCli, {}), "--warmup");
  EXPECT_EQ(as_asked(Option::kAmp, FrontEnd::kPython, {}), "as asked with amp");
  EXPECT_EQ(as_asked(Option::kAmp, FrontEnd::kCli, {}), "as asked with --amp");
  EXPECT_EQ(as_asked(Option::kAmp, FrontEnd::kPython,
                     {{Option::kAmp, "the Trainer's precision '32-true'"}}),
            "the Trainer's precision '32-true'");
}

}  // namespace
}  // namespace batchtune
