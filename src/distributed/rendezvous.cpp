// The rendezvous of the ranks at the job's c10d store.
#include "distributed/rendezvous.h"

#include <fmt/format.h>

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "distributed/wait.h"

namespace batchtune {
namespace {

/// The rendezvous waits this much longer than --timeout before it gives up
/// on a listener that never answers: TCPStore's own timeout error (nobody
/// listening, a rank missing) comes first.
constexpr std::chrono::milliseconds kStoreAnswerGrace{1000};
/// How often a rank waiting for the store looks for an interrupt.
constexpr std::chrono::milliseconds kInterruptPoll{100};

}  // namespace

c10::intrusive_ptr<c10d::TCPStore> connect_store(const RankEnvironment& env, bool server,
                                                 std::chrono::milliseconds timeout,
                                                 bool count_worker) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env.master_port);
  options.isServer = server;
  if (count_worker) options.numWorkers = static_cast<size_t>(env.world_size);
  options.waitWorkers = count_worker;
  options.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
}

c10::intrusive_ptr<c10d::TCPStore> rendezvous(const RankEnvironment& env, bool server,
                                              std::chrono::milliseconds timeout, Clock& clock) {
  struct Attempt {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    c10::intrusive_ptr<c10d::TCPStore> store;
    std::exception_ptr error;
  };
  auto attempt = std::make_shared<Attempt>();
  std::thread([attempt, env, server, timeout] {
    c10::intrusive_ptr<c10d::TCPStore> store;
    std::exception_ptr error;
    try {
      store = connect_store(env, server, timeout, /*count_worker=*/true);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(attempt->mutex);
    attempt->store = std::move(store);
    attempt->error = error;
    attempt->done = true;
    attempt->done_cv.notify_all();
  }).detach();
  const double deadline_s =
      clock.now_s() + std::chrono::duration<double>(timeout + kStoreAnswerGrace).count();
  std::unique_lock<std::mutex> lock(attempt->mutex);
  if (!wait_polling_interrupts(clock, deadline_s,
                               std::chrono::duration<double>(kInterruptPoll).count(),
                               attempt->done_cv, lock, [&] { return attempt->done; })) {
    throw RankFailure(fmt::format(
        "rank {}: no rendezvous with the store at {}:{} within {} s: no c10d store answered "
        "there (nothing listening, or a listener that is not a store); check MASTER_ADDR and "
        "MASTER_PORT, and that rank 0 runs",
        env.rank, env.master_addr, env.master_port, timeout.count() / 1000.0));
  }
  if (attempt->error) std::rethrow_exception(attempt->error);
  return attempt->store;
}

}  // namespace batchtune
