#include "batchtune/data/sample_cursor.h"

#include <c10/util/Exception.h>

namespace batchtune {

SampleCursor::SampleCursor(int64_t dataset_size, int64_t global_batch) : size_(dataset_size) {
  TORCH_CHECK(global_batch >= 1 && global_batch <= dataset_size,
              "SampleCursor: the global batch must be in [1, ", dataset_size, "], got ",
              global_batch);
  segments_.push_back({0, global_batch, {0, 0}});
}

void SampleCursor::change(int64_t step, int64_t global_batch) {
  TORCH_CHECK(global_batch >= 1 && global_batch <= size_,
              "SampleCursor: the global batch must be in [1, ", size_, "], got ", global_batch);
  TORCH_CHECK(step >= segments_.back().first_step, "SampleCursor: a change at step ", step,
              " is before the last one, at ", segments_.back().first_step);
  SamplePosition start = at(step);
  // The samples left in the epoch do not make a whole batch of the new size.
  if (size_ - start.offset < global_batch) start = {start.epoch + 1, 0};
  if (segments_.back().first_step == step) segments_.pop_back();
  segments_.push_back({step, global_batch, start});
}

const SampleCursor::Segment& SampleCursor::segment_of(int64_t step) const {
  TORCH_CHECK(step >= 0, "SampleCursor: negative step ", step);
  for (auto it = segments_.rbegin(); it != segments_.rend(); ++it) {
    if (it->first_step <= step) return *it;
  }
  return segments_.front();
}

SamplePosition SampleCursor::at(int64_t step) const {
  const Segment& s = segment_of(step);
  const int64_t b = s.global_batch;
  const int64_t k = step - s.first_step;
  const int64_t left_in_first = (size_ - s.start.offset) / b;
  if (k < left_in_first) return {s.start.epoch, s.start.offset + k * b};
  const int64_t per_epoch = size_ / b;
  const int64_t later = k - left_in_first;
  return {s.start.epoch + 1 + later / per_epoch, (later % per_epoch) * b};
}

int64_t SampleCursor::global_batch(int64_t step) const { return segment_of(step).global_batch; }

int64_t SampleCursor::first_step_of(int64_t epoch) const {
  const Segment& s = segments_.back();
  // Epochs the last change starts in or after are what is asked for (the
  // end of a run); an earlier one is over already.
  if (epoch <= s.start.epoch) return s.first_step;
  const int64_t b = s.global_batch;
  return s.first_step + (size_ - s.start.offset) / b + (epoch - s.start.epoch - 1) * (size_ / b);
}

}  // namespace batchtune
