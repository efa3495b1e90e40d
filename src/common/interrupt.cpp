#include "batchtune/common/interrupt.h"

#include <fmt/format.h>

#include <atomic>
#include <csignal>

namespace batchtune {
namespace {

// Lock-free atomics are async-signal-safe; the handler touches nothing else
// but the signal disposition.
std::atomic<int> requested_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

struct sigaction previous_int;
struct sigaction previous_term;
struct sigaction previous_hup;

void on_signal(int signal) {
  int expected = 0;
  if (!requested_signal.compare_exchange_strong(expected, signal)) {
    // The second signal: the user means it. End the way the default would.
    std::signal(signal, SIG_DFL);
    std::raise(signal);
  }
}

/// Catches `signal` unless it was inherited as ignored (`nohup`, a
/// background job of a script, which a shell runs with SIGINT ignored): an
/// ignored signal stays ignored. `previous` keeps what to restore.
void catch_unless_ignored(int signal, const struct sigaction& action,
                          struct sigaction* previous) {
  sigaction(signal, nullptr, previous);
  if (previous->sa_handler != SIG_IGN) sigaction(signal, &action, nullptr);
}

}  // namespace

InterruptHandler::InterruptHandler() {
  requested_signal = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  // No SA_RESTART: a blocking read or sleep returns early with EINTR.
  catch_unless_ignored(SIGINT, action, &previous_int);
  catch_unless_ignored(SIGTERM, action, &previous_term);
  // The terminal closed or the ssh connection dropped: the same request.
  catch_unless_ignored(SIGHUP, action, &previous_hup);
}

InterruptHandler::~InterruptHandler() {
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
  sigaction(SIGHUP, &previous_hup, nullptr);
}

bool interrupt_requested() { return requested_signal.load() != 0; }

int interrupt_signal() { return requested_signal.load(); }

int interrupt_exit_code() {
  const int signal = requested_signal.load();
  return signal == 0 ? 0 : 128 + signal;
}

std::string interrupt_name() {
  switch (requested_signal.load()) {
    case 0: return "";
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return fmt::format("signal {}", requested_signal.load());
  }
}

void request_interrupt(int signal) { requested_signal = signal; }

void throw_if_interrupted() {
  if (interrupt_requested()) throw Interrupted();
}

}  // namespace batchtune
