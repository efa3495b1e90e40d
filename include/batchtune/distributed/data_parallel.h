#pragma once

// Data-parallel training over a `Communicator`: each rank takes its shard of
// every logical batch, gradients are averaged across ranks before each
// optimizer step, and what must agree (parameters, the plan, an
// out-of-memory, the test accuracy) is shared.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "batchtune/plan/plan.h"
#include "batchtune/step/lockstep.h"

namespace batchtune {

class Communicator;
class DeviceMemory;

/// Rank `rank`'s part of one logical batch: the contiguous
/// `indices.size() / world_size` samples from `rank` × that. The plan keeps
/// the global batch a multiple of the world size, so no sample is on two
/// ranks and none is left out.
///
/// Example:
/// ```
///   shard_batch({7, 3, 9, 1}, 1, 2);  // {9, 1}
/// ```
std::vector<int64_t> shard_batch(const std::vector<int64_t>& indices, int64_t rank,
                                 int64_t world_size);
/// Rank `rank`'s share [begin, end) of `size` items (evaluation): the first
/// `size % world_size` ranks take one more.
std::pair<int64_t, int64_t> shard_range(int64_t size, int64_t rank, int64_t world_size);

/// Gradient buckets hold at most this many bytes (PyTorch DDP's 25 MiB): few
/// collectives per step, while each bucket's copy overlaps the next one's
/// all-reduce.
constexpr int64_t kGradientBucketBytes = 25 << 20;

/// What the training loop asks of the other ranks. With no communicator
/// (or one process) every call is a no-op that returns the local value. It
/// is also the `RankMaximum` of trials in lockstep.
class DataParallel : public RankMaximum {
 public:
  explicit DataParallel(Communicator* communicator = nullptr) : communicator_(communicator) {}

  int64_t rank() const;
  int64_t world_size() const;
  bool distributed() const { return world_size() > 1; }

  std::vector<int64_t> shard(const std::vector<int64_t>& indices) const {
    return shard_batch(indices, rank(), world_size());
  }
  /// Every rank takes rank 0's values of `tensors` (parameters, buffers).
  void broadcast_from_first(const std::vector<at::Tensor>& tensors);

  /// The outcome of a logical batch on every rank: whether any ran out of
  /// memory, and the loss averaged over ranks (`loss` may be undefined on an
  /// out-of-memory rank). One small all-reduce.
  struct StepOutcome {
    bool out_of_memory = false;
    at::Tensor loss;
  };
  StepOutcome share_step(bool out_of_memory, const at::Tensor& loss, c10::Device device);

  /// Averages the gradients of `parameters` over the ranks, in buckets of
  /// `kGradientBucketBytes` all-reduced back to back. A parameter without a
  /// gradient counts as zeros.
  ///
  /// The flat bucket copies take memory a step no longer holds; an
  /// out-of-memory making them (the allocator's counter of `memory`, when
  /// given, decides as `classify_step_failure` does) is agreed on by every
  /// rank in one small all-reduce before any gradient is sent: where a rank
  /// could not make its buckets, every rank sums each gradient in place
  /// instead (no copy; `in_place_averages()` counts these); where a rank
  /// could not even make its missing gradients, every rank throws
  /// `batchtune::Error` at once, rather than the others waiting the whole
  /// collective timeout.
  void average_gradients(const std::vector<at::Tensor>& parameters,
                         const DeviceMemory* memory = nullptr);
  /// Seconds spent in `average_gradients` so far.
  double communication_seconds() const { return communication_seconds_; }
  /// Averages done gradient by gradient in place, because a rank had no
  /// memory for the buckets.
  int64_t in_place_averages() const { return in_place_averages_; }

  /// The sum over ranks of `value`.
  int64_t sum(int64_t value);
  /// The minimum over ranks of `value`.
  int64_t min(int64_t value);
  std::vector<double> max_over_ranks(const std::vector<double>& values) override;
  /// Rank 0's plan, on every rank: one job, one plan.
  Plan agree_plan(const Plan& plan);

 private:
  Communicator* communicator_;
  double communication_seconds_ = 0;
  int64_t in_place_averages_ = 0;
};

}  // namespace batchtune
