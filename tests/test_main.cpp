// The test binary's main: installs the CPU budget allocator before any tensor
// exists (as the CLI does), lifts the budget before each test, gives the process
// a temp directory of its own, and leaves out GPU-only tests (`*_CUDA`) when no
// CUDA device is present.
#include <ftw.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <torch/cuda.h>

#include <string>

#include "batchtune/memory/budget_allocator.h"

namespace {

/// Each test starts with no CPU budget, whatever the one before it set.
class UnlimitedBudgetPerTest : public testing::EmptyTestEventListener {
  void OnTestStart(const testing::TestInfo&) override {
    batchtune::BudgetAllocator::installed()->set_budget(batchtune::BudgetAllocator::kUnlimited);
  }
};

/// ctest runs each test in a process of its own, in parallel: two tests that
/// write the same name under ::testing::TempDir() would race. Each process gets
/// a fresh directory (through TEST_TMPDIR, which TempDir() reads), removed at
/// exit; a worker process started by a test inherits its parent's.
/// POSIX, not std::filesystem: the torch wheel's libtorch.so exports its own
/// std::filesystem symbols, and its remove_all crashes when called from here.
class PrivateTempDir {
 public:
  PrivateTempDir() {
    if (getenv("TEST_TMPDIR") != nullptr) return;
    const char* tmp = getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                          "/batchtune_test_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) return;  // TempDir() falls back to the system's
    path_ = pattern;
    setenv("TEST_TMPDIR", path_.c_str(), 1);
  }
  ~PrivateTempDir() {
    if (path_.empty()) return;
    nftw(path_.c_str(), &remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  }
  PrivateTempDir(const PrivateTempDir&) = delete;
  PrivateTempDir& operator=(const PrivateTempDir&) = delete;

 private:
  static int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
    remove(path);
    return 0;  // go on past an entry that would not go
  }

  std::string path_;
};

}  // namespace

int main(int argc, char** argv) {
  batchtune::BudgetAllocator::install();
  const PrivateTempDir temp_dir;
  testing::InitGoogleTest(&argc, argv);
  testing::UnitTest::GetInstance()->listeners().Append(new UnlimitedBudgetPerTest);
  if (!torch::cuda::is_available()) {
    std::string filter = testing::GTEST_FLAG(filter);
    filter += filter.find('-') == std::string::npos ? "-*_CUDA" : ":*_CUDA";
    testing::GTEST_FLAG(filter) = filter;
  }
  return RUN_ALL_TESTS();
}
