#include "distributed_flags.h"

#include <fmt/format.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cmath>

#include "batchtune/monitoring/environment.h"
#include "batchtune/common/error.h"

namespace batchtune::cli {

void add_distributed_flags(CLI::App& app, DistributedFlags& flags) {
  app.add_option("--timeout", flags.timeout_s,
                 "data parallel: seconds before a gone or hung rank makes the others fail")
      ->capture_default_str();
}

RankEnvironment place_rank(const DistributedFlags& flags, WorkloadFlags& workload) {
  if (!(flags.timeout_s > 0)) {
    throw Error(fmt::format("--timeout: must be a positive number of seconds, got {}",
                            flags.timeout_s));
  }
  RankEnvironment env = rank_environment();
  if (!env.distributed()) return env;
  if ((workload.device == "auto" || workload.device == "cuda") && torch::cuda::is_available()) {
    std::string note;
    workload.device = fmt::format(
        "cuda:{}", rank_gpu(env, static_cast<int64_t>(torch::cuda::device_count()), &note));
    if (!note.empty()) fmt::print(stderr, "batchtune: {}\n", note);
  }
  if (workload.threads == 0 && workload.device.rfind("cuda", 0) != 0) {
    workload.threads = std::max<int>(1, available_cores() / static_cast<int>(env.local_world_size));
  }
  return env;
}

Job join_job(const DistributedFlags& flags, const RankEnvironment& env, c10::Device device) {
  Job job;
  job.env = env;
  job.communicator = make_communicator(
      env, device, std::chrono::milliseconds(static_cast<int64_t>(std::llround(flags.timeout_s * 1000))));
  return job;
}

std::ostream& null_stream() {
  static std::ostream stream(nullptr);
  return stream;
}

}  // namespace batchtune::cli
