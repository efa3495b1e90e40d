#pragma once

// Runs the batchtune executable the build made, for tests of the CLI.

#include <poll.h>
#include <signal.h>

#include <csignal>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
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

/// Runs the CLI, sends it `signal` once its output contains `marker`, and
/// waits for it to end. `exit_code` is -1 when it did not exit by itself
/// (for example, when the signal killed it), or when the marker never came
/// within `timeout_s` (the process is then killed).
inline CliResult run_cli_and_signal(const std::string& args, const std::string& marker,
                                    int signal, double timeout_s = 120) {
  CliResult result;
  int fds[2];
  if (pipe(fds) != 0) return result;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    // The CLI as a terminal starts it: whatever the test runner inherited
    // (a background job of a script runs with SIGINT ignored, and an ignored
    // signal stays ignored across exec and in the CLI).
    for (const int caught : {SIGINT, SIGTERM, SIGHUP}) std::signal(caught, SIG_DFL);
    const std::string command = std::string(BATCHTUNE_CLI_PATH) + " " + args;
    execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  const auto start = std::chrono::steady_clock::now();
  bool signalled = false;
  std::array<char, 4096> buffer{};
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > timeout_s) {
      kill(pid, SIGKILL);
      break;
    }
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = read(fds[0], buffer.data(), buffer.size());
    if (n <= 0) break;
    result.output.append(buffer.data(), static_cast<size_t>(n));
    if (!signalled && result.output.find(marker) != std::string::npos) {
      kill(pid, signal);
      signalled = true;
    }
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code = signalled && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace batchtune::testing
