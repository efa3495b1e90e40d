#pragma once

#include <cstdint>
#include <vector>

namespace batchtune {

/// Where an optimizer step's samples start: the epoch, and the offset into
/// that epoch's visiting order.
struct SamplePosition {
  int64_t epoch = 0;
  int64_t offset = 0;
};

/// Which samples each optimizer step takes when the global batch may change
/// as training goes (`train --adapt`): step s takes the next `global batch`
/// samples of its epoch's order, and an epoch ends where fewer than a batch
/// are left (those are dropped, as with a fixed batch). A change takes effect
/// at the step it names without restarting the epoch or skipping a sample.
/// Positions follow from the changes alone, so a loader may ask for any step
/// ahead of time, and a resumed run replays the changes to the same places.
///
/// Example:
/// ```
///   batchtune::SampleCursor cursor(1000, 64);  // 15 steps an epoch
///   cursor.change(10, 128);                    // step 10 starts at sample 640
///   cursor.at(12);                             // {epoch 1, offset 0}: 360 left < 2 x 128
/// ```
class SampleCursor {
 public:
  SampleCursor(int64_t dataset_size, int64_t global_batch);

  /// From step `step` on, steps take `global_batch` samples. `step` must not
  /// be before the last change.
  void change(int64_t step, int64_t global_batch);
  SamplePosition at(int64_t step) const;
  /// The global batch of step `step`.
  int64_t global_batch(int64_t step) const;
  /// The first step at epoch `epoch` or later.
  int64_t first_step_of(int64_t epoch) const;
  int64_t dataset_size() const { return size_; }

 private:
  struct Segment {
    int64_t first_step;
    int64_t global_batch;
    SamplePosition start;
  };
  const Segment& segment_of(int64_t step) const;

  int64_t size_;
  std::vector<Segment> segments_;
};

}  // namespace batchtune
