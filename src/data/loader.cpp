#include "batchtune/data/loader.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <system_error>

#include "batchtune/memory/budget_allocator.h"
#include "batchtune/common/error.h"
#include "batchtune/common/option.h"

namespace batchtune {
namespace {

/// The augmentation draw of batch `number`: spread over 64 bits so that
/// neighbouring batches and seeds do not share generator states.
uint64_t draw_of(uint64_t seed, int64_t number) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(number);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

Loader::Loader(const Dataset& data, BatchIndices indices, LoaderOptions options)
    : data_(data), indices_(std::move(indices)), options_(std::move(options)) {
  if (options_.workers() < 0) {
    throw OptionError(Option::kWorkers,
                      fmt::format("must be 0 (load on the training thread) or more, got {}",
                                  options_.workers()));
  }
  if (options_.prefetch() < 0) {
    throw OptionError(Option::kPrefetch, fmt::format("must be 0 or more batches per worker, got {}",
                                                     options_.prefetch()));
  }
  if (options_.workers() > kMaxWorkers) {
    throw OptionError(Option::kWorkers,
                      fmt::format("must be at most {}, got {}", kMaxWorkers, options_.workers()));
  }
  TORCH_CHECK(indices_, "Loader: needs the batches' indices");
  scheduled_ = taken_ = options_.first_batch();
  try {
    for (int64_t i = 0; i < options_.workers(); ++i) threads_.emplace_back([this] { work(); });
  } catch (const std::system_error& e) {
    // Out of threads (a ulimit, or the process's limit): the ones started
    // are stopped and joined, so that none is destroyed while joinable.
    const size_t started = threads_.size();
    stop_workers();
    throw OptionError(Option::kWorkers, std::to_string(options_.workers()),
                      fmt::format("cannot start loader thread {} ({}); use fewer workers",
                                  started + 1, e.what()));
  }
  if (options_.workers() > 0) refill();  // start building before the first next()
}

Loader::~Loader() { stop_workers(); }

void Loader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& thread : threads_) thread.join();
  threads_.clear();
}

Batch Loader::build(const Task& task) const {
  // Host staging memory, not the device's: outside the CPU budget.
  BudgetAllocator::UncountedScope uncounted;
  Batch batch = data_.draw_batch(task.indices, draw_of(options_.seed(), task.number));
  if (options_.pin_memory()) {
    for (auto& input : batch.inputs) input = input.pin_memory();
    if (batch.target.defined()) batch.target = batch.target.pin_memory();
  }
  return batch;
}

void Loader::work() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (stopping_) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    std::optional<Batch> batch;
    std::exception_ptr error;
    try {
      batch = build(task);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error) {
        errors_[task.number] = error;
      } else {
        ready_[task.number] = std::move(*batch);
      }
    }
    batch_ready_.notify_all();
  }
}

void Loader::refill() {
  const int64_t ahead = std::max<int64_t>(1, options_.workers() * options_.prefetch());
  while (!exhausted_ && scheduled_ - taken_ < ahead) {
    std::optional<std::vector<int64_t>> indices = indices_(scheduled_);
    if (!indices) {
      exhausted_ = true;
      break;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.push_back({scheduled_, std::move(*indices)});
    }
    ++scheduled_;
    work_ready_.notify_one();
  }
}

std::optional<Batch> Loader::next() {
  if (failed_) std::rethrow_exception(failed_);
  const Clock& clock = options_.clock() != nullptr ? *options_.clock() : steady_clock();
  const double start_s = clock.now_s();
  const auto waited = [&] { wait_seconds_ += clock.now_s() - start_s; };
  if (options_.workers() == 0) {
    if (exhausted_) return std::nullopt;
    std::optional<std::vector<int64_t>> indices = indices_(taken_);
    if (!indices) {
      exhausted_ = true;
      return std::nullopt;
    }
    try {
      Batch batch = build({taken_, std::move(*indices)});
      ++taken_;
      waited();
      return batch;
    } catch (...) {
      failed_ = std::current_exception();
      throw;
    }
  }
  refill();
  if (taken_ == scheduled_) return std::nullopt;  // exhausted, all handed out
  std::unique_lock<std::mutex> lock(mutex_);
  batch_ready_.wait(lock, [&] { return ready_.count(taken_) > 0 || errors_.count(taken_) > 0; });
  if (const auto error = errors_.find(taken_); error != errors_.end()) {
    failed_ = error->second;
    lock.unlock();
    waited();
    std::rethrow_exception(failed_);
  }
  auto node = ready_.extract(taken_);
  ++taken_;
  lock.unlock();
  refill();  // the slot just freed: start the next batch at once
  waited();
  return std::move(node.mapped());
}

}  // namespace batchtune
