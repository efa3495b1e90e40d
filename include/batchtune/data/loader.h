#pragma once

#include <torch/arg.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "batchtune/common/clock.h"
#include "batchtune/data/dataset.h"
#include "batchtune/data/loader_limits.h"

namespace batchtune {

/// How a `Loader` builds batches.
struct LoaderOptions {
  /// Threads building batches; 0 builds each batch on the calling thread
  /// when it is asked for.
  TORCH_ARG(int64_t, workers) = 0;
  /// Batches built ahead per worker (as PyTorch's `prefetch_factor`): at most
  /// `workers × prefetch` are queued or being built at any time (at least 1).
  TORCH_ARG(int64_t, prefetch) = kDefaultPrefetch;
  /// Copies each finished batch into page-locked host memory (CUDA only:
  /// such a batch moves to the device with `non_blocking`).
  TORCH_ARG(bool, pin_memory) = false;
  /// The number of the first batch: batch n's samples are asked for as n,
  /// and its random augmentation is drawn from (`seed`, n).
  TORCH_ARG(int64_t, first_batch) = 0;
  TORCH_ARG(uint64_t, seed) = 0;
  /// The clock `Loader::wait_seconds` is read on (a fake in tests); null for
  /// the steady clock. It must outlive the loader.
  TORCH_ARG(ConstClockPointer, clock) = nullptr;
};

/// The samples of batch `n`, or nullopt after the last batch. Called on the
/// thread that constructs the loader and calls `Loader::next`, in order of
/// n, each n once, up to `workers × prefetch` batches ahead.
using BatchIndices = std::function<std::optional<std::vector<int64_t>>(int64_t n)>;

/// Builds batches of `data` in the background and hands them out in order.
/// Each worker builds whole batches (`Dataset::draw_batch`); a bounded
/// queue keeps `workers × prefetch` batches ahead. The batches, and their
/// order, depend on the index lists and the seed only, never on the worker
/// count or timing. An exception in a worker (a corrupt file, named in its
/// message) is thrown by the `next()` that asks for that batch. The
/// destructor stops the workers and joins them; batches built ahead are
/// dropped.
///
/// Example:
/// ```
///   batchtune::Loader loader(
///       data, [&](int64_t n) { return n < 100 ? std::optional(batch_indices(n)) : std::nullopt; },
///       batchtune::LoaderOptions().workers(2).prefetch(2));
///   while (auto batch = loader.next()) train_on(*batch);
/// ```
class Loader {
 public:
  Loader(const Dataset& data, BatchIndices indices, LoaderOptions options = {});
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  /// The next batch, nullopt after the last. Rethrows the error of a worker
  /// that failed to build it (and again on later calls).
  std::optional<Batch> next();

  /// Seconds `next()` spent waiting for (or, without workers, building) batches.
  double wait_seconds() const { return wait_seconds_; }
  /// Batches handed out.
  int64_t batches() const { return taken_ - options_.first_batch(); }
  const LoaderOptions& options() const { return options_; }

 private:
  struct Task {
    int64_t number;
    std::vector<int64_t> indices;
  };
  Batch build(const Task& task) const;
  void work();
  void stop_workers();
  /// Queues batches until `workers × prefetch` are ahead or there are no more.
  void refill();

  const Dataset& data_;
  BatchIndices indices_;
  LoaderOptions options_;
  int64_t scheduled_ = 0;  // the next batch number to queue
  int64_t taken_ = 0;      // the next batch number to hand out
  bool exhausted_ = false;
  double wait_seconds_ = 0;
  std::exception_ptr failed_;

  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable batch_ready_;
  std::deque<Task> tasks_;
  std::map<int64_t, Batch> ready_;
  std::map<int64_t, std::exception_ptr> errors_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace batchtune
