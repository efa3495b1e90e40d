// torchrun's environment, and the communicator of one process: shared by the
// c10d build and the stub.
#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <limits>

#include "batchtune/distributed/distributed.h"
#include "batchtune/common/error.h"

namespace batchtune {
namespace {

int64_t parse_count(const char* name, const char* text, int64_t min,
                    int64_t max = kMaxWorldSize) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < min || value > max) {
    throw Error(fmt::format("{}: must be an integer from {} to {}, got '{}'; launch with "
                            "torchrun or batchtune launch",
                            name, min, max, text));
  }
  return value;
}

class LocalCommunicator final : public Communicator {
 public:
  int64_t rank() const override { return 0; }
  int64_t world_size() const override { return 1; }
  std::string backend() const override { return "local"; }
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  void all_reduce(at::Tensor&, ReduceOp) override {}
  std::unique_ptr<PendingCollective> start_all_reduce_sum(at::Tensor&) override {
    struct Done final : PendingCollective {
      void wait() override {}
    };
    return std::make_unique<Done>();
  }
  void broadcast(std::vector<at::Tensor>&, int64_t) override {}
  void report_failure(const std::string&) override {}
};

}  // namespace

RankEnvironment parse_rank_environment(const std::function<const char*(const char*)>& lookup) {
  RankEnvironment env;
  const char* world = lookup("WORLD_SIZE");
  if (world == nullptr) return env;
  env.world_size = parse_count("WORLD_SIZE", world, 1);
  if (env.world_size == 1) return env;
  const auto required = [&](const char* name) {
    const char* value = lookup(name);
    if (value == nullptr || *value == '\0') {
      throw Error(fmt::format("{}: not set, but WORLD_SIZE is {}; launch with torchrun or "
                              "batchtune launch, which set it",
                              name, env.world_size));
    }
    return value;
  };
  env.rank = parse_count("RANK", required("RANK"), 0);
  if (env.rank >= env.world_size) {
    throw Error(fmt::format("RANK: {} is not below WORLD_SIZE {}; ranks count from 0", env.rank,
                            env.world_size));
  }
  env.master_addr = required("MASTER_ADDR");
  const int64_t port = parse_count("MASTER_PORT", required("MASTER_PORT"), 1,
                                   std::numeric_limits<int64_t>::max());
  if (port > 65535) {
    throw Error(fmt::format("MASTER_PORT: {} is not a TCP port (1-65535)", port));
  }
  env.master_port = static_cast<int>(port);
  if (const char* local = lookup("LOCAL_RANK")) env.local_rank = parse_count("LOCAL_RANK", local, 0);
  if (const char* local = lookup("LOCAL_WORLD_SIZE")) {
    env.local_world_size = parse_count("LOCAL_WORLD_SIZE", local, 1);
  } else {
    env.local_world_size = env.world_size;
  }
  if (env.local_rank >= env.local_world_size) {
    throw Error(fmt::format("LOCAL_RANK: {} is not below LOCAL_WORLD_SIZE {}", env.local_rank,
                            env.local_world_size));
  }
  const char* agent = lookup("TORCHELASTIC_USE_AGENT_STORE");
  env.use_agent_store = agent != nullptr && std::string(agent) == "True";
  return env;
}

RankEnvironment rank_environment() {
  return parse_rank_environment([](const char* name) { return std::getenv(name); });
}

int64_t rank_gpu(const RankEnvironment& env, int64_t device_count, std::string* note) {
  if (env.local_rank < device_count) return env.local_rank;
  if (note != nullptr) {
    *note = fmt::format(
        "rank {}: LOCAL_RANK {} but this process sees {} GPU(s): training on cuda:0, as "
        "where each rank is given a GPU of its own (CUDA_VISIBLE_DEVICES)",
        env.rank, env.local_rank, device_count);
  }
  return 0;
}

std::string shared_gpu_message(const RankEnvironment& env, const std::string& message) {
  if (message.find("Duplicate GPU") == std::string::npos) return {};
  return fmt::format(
      "rank {}: NCCL needs one GPU per rank, and two ranks of this job share one ({} "
      "rank(s) on this node); start as many ranks per node as it has GPUs, or give each rank "
      "its own with CUDA_VISIBLE_DEVICES",
      env.rank, env.local_world_size);
}

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>();
}

}  // namespace batchtune
