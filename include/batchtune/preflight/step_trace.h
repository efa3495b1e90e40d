#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "batchtune/preflight/caching_allocator_model.h"
#include "batchtune/step/amp.h"
#include "batchtune/step/workload.h"

namespace batchtune {

/// A real step's memory, event by event, and what each storage is.
struct StepTrace {
  AllocationTrace events;
  /// `parameters` (the model's parameters and buffers, there before the
  /// step), `gradients` and `optimizer_state` (live at the end), and
  /// `activations` for the rest: the forward's and the backward's tensors,
  /// which an allocator-level recording cannot tell apart, and the
  /// gradients when the step frees them after the optimizer's step (as
  /// `TrainingStep` does).
  std::map<int64_t, std::string> category;
};

/// Records the CPU allocations of two real training steps of `workload` (on
/// the CPU, at `amp`) at batch `batch_size`: the first creates the
/// optimizer's state, the second runs with it. The trace starts with the
/// model's parameters and buffers. The workload's parameters and optimizer
/// state are put back afterwards (`TrainingSnapshot`). Every CPU allocation
/// of the process passes through a recording allocator from the first call
/// on (installed above the emulated device's, and kept: LibTorch cannot
/// lower an allocator's priority back).
StepTrace record_cpu_step(Workload& workload, AmpMode amp, int64_t batch_size);

/// A step's trace at any batch from real traces at a few small ones: each
/// event's size a straight line through its sizes at the first two batches.
/// The traces must make the same events in the same order (the same ops,
/// whatever the batch); the third trace, when given, checks the lines.
///
/// Example:
/// ```
///   batchtune::LinearTrace linear({{2, record_cpu_step(w, amp, 2)},
///                                  {4, record_cpu_step(w, amp, 4)},
///                                  {6, record_cpu_step(w, amp, 6)}});
///   AllocationTrace at_1000 = linear.at(1000);
/// ```
class LinearTrace {
 public:
  /// Throws `batchtune::Error` when fewer than two traces are given, their
  /// batches are not distinct, or the traces' events differ in kind or order.
  explicit LinearTrace(const std::vector<std::pair<int64_t, StepTrace>>& traces);

  /// The trace at batch `n` (sizes rounded up, never below 0).
  AllocationTrace at(int64_t n) const;
  /// Events whose size at the third batch is off its line (0 with two traces).
  int64_t off_line_events() const { return off_line_; }
  /// What each storage is (from the first trace).
  const std::map<int64_t, std::string>& category() const { return category_; }

 private:
  AllocationTrace base_;
  std::vector<double> slope_;
  std::vector<double> intercept_;
  std::map<int64_t, std::string> category_;
  int64_t off_line_ = 0;
};

}  // namespace batchtune
