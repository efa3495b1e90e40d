// The communicator over PyTorch's c10d: a TCPStore for the rendezvous
// (rendezvous.cpp), Gloo on CPU, NCCL on CUDA (when the build has it). A
// heartbeat in the store lets a rank whose collective failed say which rank
// is gone.
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef BATCHTUNE_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <c10/util/Logging.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "batchtune/distributed/distributed.h"
#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/common/option.h"
#include "distributed/nccl_options.h"
#include "distributed/rendezvous.h"
#include "distributed/wait.h"
#include "memory/cuda_support.h"

namespace batchtune {
namespace {

/// How often a rank bumps its heartbeat counter in the store.
constexpr std::chrono::milliseconds kHeartbeatPeriod{500};
/// How long a failed rank watches the others' heartbeats: several periods,
/// so that a live rank is never taken for a dead one.
constexpr std::chrono::milliseconds kHeartbeatWatch{2000};
/// The store lookups of that diagnosis give up after this long.
constexpr std::chrono::milliseconds kDiagnosisStoreTimeout{3000};

std::string alive_key(int64_t rank) { return fmt::format("batchtune/alive/{}", rank); }
std::string failed_key(int64_t rank) { return fmt::format("batchtune/failed/{}", rank); }

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (const auto& part : parts) out += (out.empty() ? "" : separator) + part;
  return out;
}

std::string to_string(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return c10d::ReduceOp::SUM;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

/// LibTorch's c10d prints a warning or an error, often with a stack trace,
/// for each failed connection and lost peer before batchtune's own one-line
/// error says what happened. Unless BATCHTUNE_VERBOSE=1 (or
/// TORCH_CPP_LOG_LEVEL is set), those lines are off and errors carry no frames.
void quiet_c10d_diagnostics() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* verbose = std::getenv("BATCHTUNE_VERBOSE");
    if (verbose != nullptr && *verbose != '\0' && std::string(verbose) != "0") return;
    // FATAL: c10d's ERROR lines too only repeat what batchtune's error says.
    if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) FLAGS_caffe2_log_level = 3;
    c10::SetStackTraceFetcher([] { return std::string(); });
  });
}

class C10dCommunicator;

/// A collective in flight whose failure is turned into a `RankFailure`.
class PendingWork final : public PendingCollective {
 public:
  PendingWork(C10dCommunicator& owner, c10::intrusive_ptr<c10d::Work> work)
      : owner_(owner), work_(std::move(work)) {}
  void wait() override;

 private:
  C10dCommunicator& owner_;
  c10::intrusive_ptr<c10d::Work> work_;
};

class C10dCommunicator final : public Communicator {
 public:
  C10dCommunicator(const RankEnvironment& env, c10::Device device,
                   std::chrono::milliseconds timeout, Clock& clock)
      : env_(env), timeout_(timeout), device_(device) {
    const bool server = env.rank == 0 && !env.use_agent_store;
    try {
      store_ = rendezvous(env, server, timeout, clock);
    } catch (const RankFailure&) {
      throw;
    } catch (const Interrupted&) {
      throw;
    } catch (const std::exception& e) {
      throw RankFailure(fmt::format(
          "rank {}: no rendezvous with the store at {}:{} within {} s: {}", env.rank,
          env.master_addr, env.master_port, timeout.count() / 1000.0,
          first_line(e.what())));
    }
    try {
      if (device.is_cuda()) {
#ifdef BATCHTUNE_WITH_NCCL
        // One GPU per rank: bind it before the group exists, so that NCCL's
        // communicator, its streams and the watchdog live on it and no rank
        // makes a context on GPU 0.
        const c10::Device bound(c10::kCUDA, device.has_index()
                                                ? device.index()
                                                : static_cast<c10::DeviceIndex>(env.local_rank));
        device_ = bound;
        cuda::set_current_device(bound.index());
        // Options::timeout applies only with blocking wait; without it a
        // collective with a gone peer never throws from wait().
        std::string note;
        if (!prefer_nccl_blocking_wait(&note)) {
          fmt::print(stderr, "batchtune: rank {}: {}\n", env.rank, note);
        }
        auto options = c10d::ProcessGroupNCCL::Options::create();
        options->timeout = timeout;
        auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
            store_, static_cast<int>(env.rank), static_cast<int>(env.world_size), options);
        nccl->setBoundDeviceId(bound);
        // The communicator forms now, inside --timeout, rather than at the
        // first collective: a rank that never came is named here.
        nccl->eagerConnectSingleDevice(bound);
        backend_ = nccl;
        name_ = "nccl";
#else
        throw OptionError(Option::kDevice,
                          fmt::format("{}: this build has no NCCL (nccl.h was not found when it "
                                      "was configured); train data-parallel on cpu, or rebuild",
                                      device.str()));
#endif
      } else {
        auto options = c10d::ProcessGroupGloo::Options::create(timeout);
        options->devices.push_back(gloo_device(env));
        backend_ = c10::make_intrusive<c10d::ProcessGroupGloo>(
            store_, static_cast<int>(env.rank), static_cast<int>(env.world_size), options);
        name_ = "gloo";
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      const std::string shared = shared_gpu_message(env, e.what());
      if (!shared.empty()) throw RankFailure(shared);
      throw RankFailure(fmt::format("rank {}: the {} process group did not form within {} s: {}",
                                    env.rank, device.is_cuda() ? "NCCL" : "Gloo",
                                    timeout.count() / 1000.0, first_line(e.what())));
    }
    heartbeat_store_ = connect_store(env, false, timeout, /*count_worker=*/false);
    heartbeat_ = std::thread([this] { beat(); });
  }

  ~C10dCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    heartbeat_.join();
    // A NCCL group destroyed without shutdown() first warns and may leak or
    // hang its communicator; after a failed collective a peer is gone and a
    // clean shutdown could wait for it, so the communicator is aborted
    // instead. Gloo's shutdown() and abort() do nothing.
    try {
      if (failed_) {
        backend_->abort();
      } else {
        backend_->shutdown();
      }
    } catch (const std::exception& e) {
      fmt::print(stderr, "batchtune: rank {}: shutting the {} group down: {}\n", env_.rank,
                 name_, first_line(e.what()));
    }
  }

  int64_t rank() const override { return env_.rank; }
  int64_t world_size() const override { return env_.world_size; }
  std::string backend() const override { return name_; }
  c10::Device device() const override { return device_; }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = to_c10d(op);
    options.timeout = timeout_;
    run([&] { return backend_->allreduce(tensors, options); })->wait();
  }

  std::unique_ptr<PendingCollective> start_all_reduce_sum(at::Tensor& tensor) override {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions options;
    options.timeout = timeout_;
    return run([&] { return backend_->allreduce(tensors, options); });
  }

  void broadcast(std::vector<at::Tensor>& tensors, int64_t root) override {
    c10d::BroadcastOptions options;
    options.rootRank = root;
    options.timeout = timeout_;
    // One tensor per collective: Gloo's multi-tensor broadcast means one
    // tensor per local device, not a list of different tensors.
    for (auto& tensor : tensors) {
      std::vector<at::Tensor> one{tensor};
      run([&] { return backend_->broadcast(one, options); })->wait();
    }
  }

  void report_failure(const std::string& message) override {
    try {
      heartbeat_store_->set(failed_key(env_.rank),
                            std::vector<uint8_t>(message.begin(), message.end()));
    } catch (const std::exception&) {
      // The store is gone too: the others will find that out themselves.
    }
  }

  /// The error of a failed collective, with the rank(s) to blame.
  [[noreturn]] void fail(const std::string& what) {
    failed_ = true;
    throw RankFailure(fmt::format("rank {}: a collective failed ({}); {}", env_.rank,
                                  first_line(what), diagnose()));
  }

 private:
  template <typename Start>
  std::unique_ptr<PendingCollective> run(Start start) {
    try {
      return std::make_unique<PendingWork>(*this, start());
    } catch (const RankFailure&) {
      throw;
    } catch (const std::exception& e) {
      fail(e.what());
    }
  }

  static std::shared_ptr<::gloo::transport::Device> gloo_device(const RankEnvironment& env) {
    // As PyTorch: GLOO_SOCKET_IFNAME names the interface; a job on one host
    // (loopback master) stays on loopback; otherwise the host name's address.
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
      return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
    }
    if (is_loopback(env.master_addr)) {
      return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    }
    return c10d::ProcessGroupGloo::createDefaultDevice();
  }

  void beat() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      lock.unlock();
      try {
        heartbeat_store_->add(alive_key(env_.rank), 1);
      } catch (const std::exception&) {
        // The store's host is gone; the next collective says so.
      }
      lock.lock();
      wake_.wait_for(lock, kHeartbeatPeriod, [this] { return stop_; });
    }
  }

  /// Which ranks reported a failure, or stopped beating.
  std::string diagnose() {
    try {
      RankEnvironment probe_env = env_;
      auto probe = connect_store(probe_env, false, kDiagnosisStoreTimeout, false);
      std::vector<std::string> reasons;
      for (int64_t r = 0; r < env_.world_size; ++r) {
        if (r != env_.rank && probe->check({failed_key(r)})) {
          reasons.push_back(fmt::format("rank {} failed: {}", r,
                                        to_string(probe->get(failed_key(r)))));
        }
      }
      if (!reasons.empty()) return join(reasons, "; ");
      const auto beats = [&] {
        std::vector<int64_t> counts;
        for (int64_t r = 0; r < env_.world_size; ++r) counts.push_back(probe->add(alive_key(r), 0));
        return counts;
      };
      const auto before = beats();
      std::this_thread::sleep_for(kHeartbeatWatch);
      const auto after = beats();
      std::vector<int64_t> silent;
      for (int64_t r = 0; r < env_.world_size; ++r) {
        if (r != env_.rank && after[static_cast<size_t>(r)] == before[static_cast<size_t>(r)]) {
          silent.push_back(r);
        }
      }
      if (silent.empty()) {
        return "every other rank is still alive: one of them failed or is slower than "
               "the collective timeout";
      }
      std::vector<std::string> names;
      for (int64_t r : silent) names.push_back(std::to_string(r));
      return fmt::format("rank {} stopped answering (exited or hung)", join(names, ", "));
    } catch (const std::exception&) {
      return env_.use_agent_store
                 ? fmt::format("the store at {}:{} is unreachable (torchrun's agent is gone)",
                               env_.master_addr, env_.master_port)
                 : fmt::format("rank 0, which hosts the store at {}:{}, is gone",
                               env_.master_addr, env_.master_port);
    }
  }

  RankEnvironment env_;
  std::chrono::milliseconds timeout_;
  c10::Device device_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  std::string name_;
  c10::intrusive_ptr<c10d::TCPStore> heartbeat_store_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::atomic<bool> failed_{false};  ///< a collective failed: abort, not shut down
  std::thread heartbeat_;
};

void PendingWork::wait() {
  try {
    work_->wait();
  } catch (const std::exception& e) {
    owner_.fail(e.what());
  }
}

}  // namespace

bool distributed_backend_compiled() { return true; }

std::unique_ptr<Communicator> make_communicator(const RankEnvironment& env, c10::Device device,
                                                std::chrono::milliseconds timeout,
                                                Clock& clock) {
  if (!env.distributed()) return make_local_communicator();
  if (timeout.count() <= 0) {
    throw Error(fmt::format("the collective timeout must be positive, got {} ms",
                            timeout.count()));
  }
  quiet_c10d_diagnostics();
  return std::make_unique<C10dCommunicator>(env, device, timeout, clock);
}

}  // namespace batchtune
