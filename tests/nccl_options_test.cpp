#include "distributed/nccl_options.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace batchtune {
namespace {

/// Restores an environment variable when the test ends.
class SavedVariable {
 public:
  explicit SavedVariable(const char* name) : name_(name) {
    if (const char* value = std::getenv(name)) saved_ = value;
    unsetenv(name);
  }
  ~SavedVariable() {
    if (saved_.empty()) {
      unsetenv(name_);
    } else {
      setenv(name_, saved_.c_str(), 1);
    }
  }

 private:
  const char* name_;
  std::string saved_;
};

TEST(NcclOptions, TurnsBlockingWaitOnWhereTheUserSaidNothing) {
  SavedVariable a("TORCH_NCCL_BLOCKING_WAIT");
  SavedVariable b("NCCL_BLOCKING_WAIT");
  std::string note;
  EXPECT_TRUE(prefer_nccl_blocking_wait(&note));
  ASSERT_NE(std::getenv("TORCH_NCCL_BLOCKING_WAIT"), nullptr);
  EXPECT_EQ(std::string(std::getenv("TORCH_NCCL_BLOCKING_WAIT")), "1");
  EXPECT_TRUE(note.empty());
}

TEST(NcclOptions, LeavesTheUsersChoiceAndSaysWhatItCosts) {
  SavedVariable a("TORCH_NCCL_BLOCKING_WAIT");
  SavedVariable b("NCCL_BLOCKING_WAIT");
  setenv("NCCL_BLOCKING_WAIT", "0", 1);
  std::string note;
  EXPECT_FALSE(prefer_nccl_blocking_wait(&note));
  EXPECT_EQ(std::getenv("TORCH_NCCL_BLOCKING_WAIT"), nullptr);
  EXPECT_NE(note.find("NCCL_BLOCKING_WAIT=0"), std::string::npos) << note;
}

}  // namespace
}  // namespace batchtune
