#pragma once

#include <exception>
#include <string>

namespace batchtune {

/// Ctrl-C (SIGINT), SIGTERM and SIGHUP (the terminal closed) as a request to stop at the next safe point
/// rather than a kill: while an `InterruptHandler` is alive, the first such
/// signal only sets a flag that long loops poll (between trials, between
/// optimizer steps); they then write what they have, marked incomplete. A
/// second signal ends the process at once, the default way.
///
/// Example:
/// ```
///   batchtune::InterruptHandler interrupts;
///   while (!batchtune::interrupt_requested()) run_one_trial();
///   if (batchtune::interrupt_requested()) return batchtune::interrupt_exit_code();
/// ```
class InterruptHandler {
 public:
  /// Installs the handlers and clears any earlier request.
  InterruptHandler();
  /// Restores the handlers that were there before.
  ~InterruptHandler();
  InterruptHandler(const InterruptHandler&) = delete;
  InterruptHandler& operator=(const InterruptHandler&) = delete;
};

/// Whether SIGINT, SIGTERM or SIGHUP arrived under an `InterruptHandler`.
bool interrupt_requested();
/// The signal that asked to stop, or 0 when none did.
int interrupt_signal();
/// 128 + the signal, as a shell reports a process a signal ended: 130 for
/// SIGINT, 143 for SIGTERM, 129 for SIGHUP. 0 when no signal arrived.
int interrupt_exit_code();
/// "SIGINT", "SIGTERM" or "SIGHUP" (or "signal N"), for messages and JSON.
std::string interrupt_name();

/// Raises a stop request as the signal would (tests, and code that must stop
/// for another reason the same way).
void request_interrupt(int signal);

/// Thrown at a safe point of a loop that cannot return its partial result
/// itself; the command catches it and writes what was measured.
class Interrupted : public std::exception {
 public:
  const char* what() const noexcept override { return "interrupted"; }
};

/// Throws `Interrupted` when a stop was requested.
void throw_if_interrupted();

}  // namespace batchtune
