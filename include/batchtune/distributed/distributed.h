#pragma once

// Processes training together: where a rank finds the others (torchrun's
// environment) and the few collectives batchtune needs, over PyTorch's own
// c10d (a TCPStore for the rendezvous, Gloo on CPU, NCCL on CUDA). A build
// without c10d links a stub: world size 1 works, more says why not.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "batchtune/common/clock.h"

namespace batchtune {

/// Most ranks in a job that batchtune accepts (`WORLD_SIZE`, `launch`):
/// far beyond any real job, and well inside c10d's `int` ranks.
constexpr int64_t kMaxWorldSize = 1 << 20;

/// Where this process stands in the job, as torchrun (or `batchtune launch`)
/// says in the environment.
struct RankEnvironment {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  int64_t local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  /// `TORCHELASTIC_USE_AGENT_STORE=True`: torchrun's agent hosts the store,
  /// so every rank, rank 0 included, connects as a client.
  bool use_agent_store = false;

  bool distributed() const { return world_size > 1; }
};

/// Reads `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
/// `MASTER_ADDR`, `MASTER_PORT` and `TORCHELASTIC_USE_AGENT_STORE` through
/// `lookup` (nullptr for unset). No `WORLD_SIZE` (or 1): one process. Throws
/// `batchtune::Error` naming the variable that is missing or wrong.
///
/// Example:
/// ```
///   RankEnvironment env = parse_rank_environment(
///       [](const char* name) { return std::getenv(name); });
/// ```
RankEnvironment parse_rank_environment(const std::function<const char*(const char*)>& lookup);
/// `parse_rank_environment` of this process's environment.
RankEnvironment rank_environment();

/// The GPU index a rank trains on when this process sees `device_count`
/// GPUs: `LOCAL_RANK`'s where it exists; else 0, as on clusters that give
/// each rank one GPU of its own (`CUDA_VISIBLE_DEVICES` per rank), with
/// `note` saying so.
int64_t rank_gpu(const RankEnvironment& env, int64_t device_count, std::string* note);

/// The one line for a NCCL group that did not form because two ranks
/// share a GPU (NCCL's "Duplicate GPU detected"); empty for any other
/// failure `message`.
std::string shared_gpu_message(const RankEnvironment& env, const std::string& message);

/// A rank failed: it exited, hung past the timeout, or reported an error.
/// The message names the rank(s). Not a user error: the CLI exits with 1.
class RankFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A collective in flight; `wait()` throws `RankFailure`.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
};

enum class ReduceOp { kSum, kMax, kMin };

/// The collectives of a process group. Tensors live on the communicator's
/// device. Every rank must call the same collectives in the same order.
///
/// Example:
/// ```
///   auto comm = batchtune::make_communicator(batchtune::rank_environment(), device,
///                                            std::chrono::seconds(300));
///   at::Tensor flag = at::ones({1});
///   comm->all_reduce(flag, batchtune::ReduceOp::kSum);  // == world size
/// ```
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int64_t rank() const = 0;
  virtual int64_t world_size() const = 0;
  /// "gloo", "nccl", or "local" for one process.
  virtual std::string backend() const = 0;
  /// Where the collectives' tensors must live (CPU for Gloo).
  virtual c10::Device device() const = 0;
  /// In place, on every rank.
  virtual void all_reduce(at::Tensor& tensor, ReduceOp op) = 0;
  /// Starts a sum all-reduce in place; the tensor may not be touched until
  /// `wait()` returned.
  virtual std::unique_ptr<PendingCollective> start_all_reduce_sum(at::Tensor& tensor) = 0;
  /// `tensors` take the values of rank `root`'s.
  virtual void broadcast(std::vector<at::Tensor>& tensors, int64_t root) = 0;
  /// Tells the others this rank is failing with `message` (best effort), so
  /// that their error names it; called before a rank gives up.
  virtual void report_failure(const std::string& message) = 0;
};

/// True when this build has a c10d backend (Gloo and/or NCCL).
bool distributed_backend_compiled();

/// The process group of `env` on `device` (Gloo for CPU, NCCL for CUDA); a
/// local communicator (no collectives) for one process. `timeout` bounds
/// the rendezvous and every collective: a rank that is gone or hung makes
/// the others throw `RankFailure` naming it, within about that time. The
/// rendezvous gives up on `clock` (a fake in tests): `timeout` and a second
/// of grace after it began, or at once at an interrupt (`Interrupted`).
/// Throws `batchtune::Error` when the build has no backend for the device.
std::unique_ptr<Communicator> make_communicator(const RankEnvironment& env, c10::Device device,
                                                std::chrono::milliseconds timeout,
                                                Clock& clock = steady_clock());

/// The communicator of one process: rank 0 of 1; collectives leave the
/// tensors as they are.
std::unique_ptr<Communicator> make_local_communicator();

}  // namespace batchtune
