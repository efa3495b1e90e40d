#pragma once

// How a rank finds the others: the c10d TCPStore at MASTER_ADDR:MASTER_PORT
// (hosted by rank 0, or by torchrun's agent), reached within a timeout and
// given up at an interrupt.

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>

#include "batchtune/common/clock.h"
#include "batchtune/distributed/distributed.h"

namespace batchtune {

/// A client of the job's store (its host when `server`); with `count_worker`,
/// one of the `world_size` workers the store waits for. Throws what TCPStore
/// throws.
c10::intrusive_ptr<c10d::TCPStore> connect_store(const RankEnvironment& env, bool server,
                                                 std::chrono::milliseconds timeout,
                                                 bool count_worker);

/// `connect_store` for the rendezvous, given up at an interrupt or after the
/// timeout on `clock` even when TCPStore's handshake would wait for ever (a
/// listener at MASTER_PORT that is not a store): `RankFailure` then, saying
/// where it looked. The attempt runs on a thread of its own, left behind when
/// given up.
c10::intrusive_ptr<c10d::TCPStore> rendezvous(const RankEnvironment& env, bool server,
                                              std::chrono::milliseconds timeout, Clock& clock);

}  // namespace batchtune
