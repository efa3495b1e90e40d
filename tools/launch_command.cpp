// batchtune launch: the ranks of a data-parallel job on this host, started
// with torchrun's environment (see batchtune/launch.h).
#include <fmt/format.h>
#include <unistd.h>

#include <iostream>

#include "batchtune/common/error.h"
#include "batchtune/distributed/launch.h"
#include "commands.h"

namespace batchtune::cli {
namespace {

struct LaunchFlags {
  int64_t nproc = 1;
  int64_t nnodes = 1;
  int64_t node_rank = 0;
  std::string master;
  std::vector<std::string> args;
};

std::string own_executable() {
  std::string path(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size());
  if (n <= 0) return "/proc/self/exe";
  path.resize(static_cast<size_t>(n));
  return path;
}

int run_launch(const LaunchFlags& flags) {
  LaunchOptions options;
  options.nproc(flags.nproc).nnodes(flags.nnodes).node_rank(flags.node_rank).args(flags.args)
      .program(own_executable());
  if (!flags.master.empty()) {
    const auto [addr, port] = parse_master(flags.master, "--master");
    options.master_addr(addr).master_port(port);
  }
  if (!flags.args.empty() && flags.args.front() == "launch") {
    throw Error("launch: the command to run is launch itself; give train, tune or probe");
  }
  const LaunchResult result = launch(options, std::cout);
  if (result.signal != 0) {
    std::cerr << "batchtune launch: " << result.message << "\n";
    return result.exit_code;
  }
  if (result.failed_rank >= 0) {
    std::cerr << "batchtune launch: " << result.message << "\n";
    return result.exit_code != 0 ? result.exit_code : 1;
  }
  return 0;
}

}  // namespace

CommandRun add_launch_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "launch", "run a batchtune command data-parallel: --nproc ranks on this host, "
                "torchrun's environment, output prefixed [rank k]");
  auto flags = std::make_shared<LaunchFlags>();
  cmd->add_option("--nproc", flags->nproc, "ranks (processes) on this host, 1 to 1024")->capture_default_str();
  cmd->add_option("--nnodes", flags->nnodes, "hosts in the job")->capture_default_str();
  cmd->add_option("--node-rank", flags->node_rank, "this host's place, 0 to --nnodes - 1")
      ->capture_default_str();
  cmd->add_option("--master", flags->master,
                  "ADDR:PORT (or [IPV6]:PORT) where rank 0 hosts the store (default: 127.0.0.1 "
                  "and a free port)");
  cmd->add_option("command", flags->args, "the batchtune command each rank runs, after --");
  return [flags] { return run_launch(*flags); };
}

}  // namespace batchtune::cli
