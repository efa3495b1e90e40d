#pragma once

// The bodies of the fuzz targets, shared by the libFuzzer executables
// (fuzz/fuzzer.cpp, built by scripts/fuzz) and by the ordinary test binary,
// which runs every saved input (fuzz/corpus/<target>/) through them.
//
// Each body takes any bytes. The expected outcome of bad input is a
// `batchtune::Error` (the CLI's one-line message, exit code 2), which the
// body swallows; anything else that escapes — another exception type, a
// crash, a sanitizer report — is a bug the fuzzer has found.

#include <string>
#include <string_view>

#include "batchtune/data/idx_file.h"
#include "batchtune/common/error.h"
#include "batchtune/data/input_spec.h"
#include "batchtune/plan/plan.h"
#include "batchtune/common/shape.h"
#include "batchtune/common/size.h"

namespace batchtune::fuzz {

template <typename F>
void expect_only_user_errors(F&& body) {
  try {
    body();
  } catch (const Error&) {
    // Bad input, reported as such: the outcome we want.
  }
}

/// `--memory-limit 12GiB` and every other size flag.
inline void size_parser(std::string_view input) {
  expect_only_user_errors([&] { parse_size(std::string(input), "--memory-limit"); });
}

/// `--input 3x224x224` and the dtype-prefixed input flags.
inline void shape_parser(std::string_view input) {
  expect_only_user_errors([&] {
    parse_shape(std::string(input), "--input");
    parse_input_tensor(std::string(input), /*vocab=*/100, "--input");
  });
}

/// `--input-spec FILE.json`.
inline void input_spec_reader(std::string_view input) {
  expect_only_user_errors([&] { parse_input_spec_json(std::string(input), "--input-spec"); });
}

/// `--plan FILE.json`, as `read_plan_file` parses it.
inline void plan_reader(std::string_view input) {
  expect_only_user_errors([&] { parse_plan_json(std::string(input), "--plan fuzz.json"); });
}

/// The Fashion-MNIST (IDX) files.
inline void idx_reader(std::string_view input) {
  expect_only_user_errors([&] { parse_idx(input, "fuzz-idx3-ubyte"); });
}

}  // namespace batchtune::fuzz
