#pragma once

// Starts the ranks of a data-parallel job on this host, as torchrun does:
// one process per rank with torchrun's environment, their output forwarded
// line by line with a `[rank k]` prefix; when one rank fails, the others are
// stopped and the launch fails too.

#include <torch/arg.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "batchtune/common/clock.h"

namespace batchtune {

/// Most ranks `launch` starts on one host: each is a process with a pipe.
constexpr int64_t kMaxLocalRanks = 1024;

struct LaunchOptions {
  /// Processes on this host.
  TORCH_ARG(int64_t, nproc) = 1;
  /// Hosts in the job, and this one's place among them.
  TORCH_ARG(int64_t, nnodes) = 1;
  TORCH_ARG(int64_t, node_rank) = 0;
  /// Where rank 0 hosts the store; port 0: a free one (one host only).
  TORCH_ARG(std::string, master_addr) = "127.0.0.1";
  TORCH_ARG(int, master_port) = 0;
  /// The program each rank runs, and its arguments (argv[1:]).
  TORCH_ARG(std::string, program) = "/proc/self/exe";
  TORCH_ARG(std::vector<std::string>, args);
  /// Extra variables for rank k: `NAME=value` strings (tests).
  TORCH_ARG(std::vector<std::vector<std::string>>, rank_env);
  /// Stop the other ranks when one fails (tests of the ranks' own fault
  /// handling turn it off).
  TORCH_ARG(bool, stop_on_failure) = true;
  /// After one rank failed, the others get SIGTERM, then SIGKILL after this.
  TORCH_ARG(double, grace_s) = 5;
  /// The clock `grace_s` and the drain of the ranks' output are read on, and
  /// that stopping the ranks waits on (a fake in tests); null for the steady
  /// clock. The ranks' output itself is waited for in real time.
  TORCH_ARG(ClockPointer, clock) = nullptr;
};

/// How the job ended.
struct LaunchResult {
  int exit_code = 0;                ///< 0, or the first failed rank's code (1 if signalled)
  int64_t failed_rank = -1;         ///< the first rank that failed, or -1
  std::string message;              ///< what happened, for people
  /// The signal (SIGINT, SIGTERM, SIGHUP) the launcher received and passed
  /// on to every rank; 0 when none. `exit_code` is then 128 + it.
  int signal = 0;
};

/// Runs the job; writes the ranks' output to `out`. While it runs, SIGINT,
/// SIGTERM and SIGHUP are passed on to every rank and the launch waits for
/// them (a second signal ends them at once); the ranks sit in their own
/// process group and get SIGTERM if the launcher dies. Throws
/// `batchtune::Error` for bad options (naming the flag), and when a rank
/// cannot be started (after stopping those that were).
///
/// Example:
/// ```
///   auto result = batchtune::launch(batchtune::LaunchOptions().nproc(2).args(
///                                       {"train", "--steps", "10"}), std::cout);
/// ```
LaunchResult launch(const LaunchOptions& options, std::ostream& out);

/// A TCP port on 127.0.0.1 free right now (the kernel's pick).
int free_tcp_port();

/// Parses `ADDR:PORT` or `[IPV6]:PORT`; throws `batchtune::Error` naming `what`.
std::pair<std::string, int> parse_master(const std::string& text, const std::string& what);

}  // namespace batchtune
