#pragma once

// The workloads the search and sweep benchmarks run: a built-in model, its
// per-sample input, and the emulated device's size.

#include <cstdint>
#include <string>
#include <vector>

#include "batchtune/data/input_spec.h"
#include "batchtune/common/shape.h"
#include "batchtune/step/workload.h"

namespace batchtune::bench {

constexpr int64_t kMiB = int64_t{1} << 20;
/// gpt's vocabulary in the benchmarks (its default).
constexpr int64_t kGptVocab = 256;

struct Case {
  const char* model;
  std::vector<int64_t> input;  ///< for gpt: {sequence length}
  int64_t limit;               ///< bytes of emulated device memory
};

inline WorkloadOptions workload_options(const Case& c) {
  if (std::string(c.model) == "gpt") {
    return WorkloadOptions().model("gpt").input_spec(token_spec(c.input[0], kGptVocab));
  }
  return WorkloadOptions().model(c.model).input_shape(c.input);
}

inline std::string describe(const Case& c) {
  return std::string(c.model) + " " + format_shape(c.input);
}

}  // namespace batchtune::bench
