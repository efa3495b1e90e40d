// The test binary's main: installs the CPU budget allocator before any tensor
// exists (as the CLI does), lifts the budget before each test, and leaves out GPU-only tests (`*_CUDA`) when no
// CUDA device is present.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "batchtune/memory/budget_allocator.h"

namespace {

/// Each test starts with no CPU budget, whatever the one before it set.
class UnlimitedBudgetPerTest : public testing::EmptyTestEventListener {
  void OnTestStart(const testing::TestInfo&) override {
    batchtune::BudgetAllocator::installed()->set_budget(batchtune::BudgetAllocator::kUnlimited);
  }
};

}  // namespace

int main(int argc, char** argv) {
  batchtune::BudgetAllocator::install();
  testing::InitGoogleTest(&argc, argv);
  testing::UnitTest::GetInstance()->listeners().Append(new UnlimitedBudgetPerTest);
  if (!torch::cuda::is_available()) {
    std::string filter = testing::GTEST_FLAG(filter);
    filter += filter.find('-') == std::string::npos ? "-*_CUDA" : ":*_CUDA";
    testing::GTEST_FLAG(filter) = filter;
  }
  return RUN_ALL_TESTS();
}
