#pragma once

// Runs the batchtune executable the build made, for tests of the CLI.

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace batchtune::testing {

struct CliResult {
  int exit_code = -1;
  std::string output;  ///< stdout and stderr together
};

inline CliResult run_cli(const std::string& args) {
  const std::string command = std::string(BATCHTUNE_CLI_PATH) + " " + args + " 2>&1";
  CliResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace batchtune::testing
