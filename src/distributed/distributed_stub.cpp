// The communicator of a build without c10d (CMake found no Gloo or NCCL
// headers): one process works, more says why not.
#include <fmt/format.h>

#include "batchtune/distributed/distributed.h"
#include "batchtune/common/error.h"

namespace batchtune {

bool distributed_backend_compiled() { return false; }

std::unique_ptr<Communicator> make_communicator(const RankEnvironment& env, c10::Device,
                                                std::chrono::milliseconds, Clock&) {
  if (!env.distributed()) return make_local_communicator();
  throw Error(fmt::format(
      "WORLD_SIZE: {} processes need a distributed backend, and this build has none (no Gloo "
      "headers found when it was configured: install libgloo-dev and rebuild)",
      env.world_size));
}

}  // namespace batchtune
