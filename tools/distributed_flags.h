#pragma once

// What train and tune share for data-parallel jobs: the --timeout flag, the
// rank's place (its device and threads) and its communicator.

#include <CLI/CLI.hpp>

#include <memory>
#include <ostream>

#include "batchtune/distributed/distributed.h"
#include "workload_flags.h"

namespace batchtune::cli {

/// A rank that is gone or hung makes the others fail after this long.
constexpr double kDefaultTimeoutS = 300;

struct DistributedFlags {
  double timeout_s = kDefaultTimeoutS;
};

void add_distributed_flags(CLI::App& app, DistributedFlags& flags);

/// This process's part of the job, from torchrun's environment.
struct Job {
  RankEnvironment env;
  std::unique_ptr<Communicator> communicator;
  bool primary() const { return env.rank == 0; }
};

/// Reads the environment and fits the workload flags to this rank: with
/// several ranks on a host, `--device auto`/`cuda` takes `cuda:LOCAL_RANK`,
/// and `--threads 0` the host's cores shared among its ranks.
RankEnvironment place_rank(const DistributedFlags& flags, WorkloadFlags& workload);
/// Joins the job's process group on `device`; one process: a local one.
Job join_job(const DistributedFlags& flags, const RankEnvironment& env, c10::Device device);
/// Where the ranks other than 0 print: nowhere.
std::ostream& null_stream();

}  // namespace batchtune::cli
