// Every saved fuzz input — the seed corpus and any input that once crashed
// a target (fuzz/corpus/<target>/) — run through the target's body as an
// ordinary test: a fixed crash stays fixed.
#include <dirent.h>
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_targets.h"

namespace {

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> files;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* entry = readdir(d)) {
      if (entry->d_name[0] != '.') files.push_back(dir + "/" + entry->d_name);
    }
    closedir(d);
  }
  return files;
}

struct Target {
  const char* name;
  std::function<void(std::string_view)> body;
};

class FuzzRegression : public ::testing::TestWithParam<Target> {};

TEST_P(FuzzRegression, SavedInputsEndInAUserErrorOrNothing) {
  const auto inputs = files_in(std::string(BATCHTUNE_FUZZ_CORPUS) + "/" + GetParam().name);
  ASSERT_FALSE(inputs.empty()) << "no saved inputs for " << GetParam().name;
  for (const auto& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    EXPECT_NO_THROW(GetParam().body(bytes.str())) << path;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Targets, FuzzRegression,
    ::testing::Values(Target{"size_parser", batchtune::fuzz::size_parser},
                      Target{"shape_parser", batchtune::fuzz::shape_parser},
                      Target{"input_spec_reader", batchtune::fuzz::input_spec_reader},
                      Target{"plan_reader", batchtune::fuzz::plan_reader},
                      Target{"idx_reader", batchtune::fuzz::idx_reader}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
