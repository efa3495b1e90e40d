#pragma once

#include <cstdint>

namespace batchtune {

/// Defaults of the input pipeline (`Loader`) where nothing tuned it: each
/// batch built on the training thread when it is asked for, so no workers
/// (`batchtune tune --data` times the worker counts); batches prefetched
/// two ahead per worker, as PyTorch's DataLoader does.
constexpr int64_t kDefaultWorkers = 0;
constexpr int64_t kDefaultPrefetch = 2;
/// Loader threads at most: each is a thread and a batch in flight, and past a
/// few per core they only contend (no host we know of has 256 cores to spare
/// for decoding); 40000 would exhaust the process's threads.
constexpr int64_t kMaxWorkers = 256;
/// Batches built ahead per worker at most: each one is host memory.
constexpr int64_t kMaxPrefetch = 64;

}  // namespace batchtune
