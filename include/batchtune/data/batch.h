#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

namespace batchtune {

/// One batch of training data, as the workload's `InputSpec` describes it.
struct Batch {
  /// The model's inputs, in order: [batch, ...shape] each.
  std::vector<at::Tensor> inputs;
  /// [batch] class indices, [batch, T] token classes or [batch, ...shape]
  /// floats; undefined when the spec has no target.
  at::Tensor target;
  /// The first input (all that single-input models take).
  const at::Tensor& input() const { return inputs.front(); }
  int64_t size() const { return inputs.front().size(0); }
};

/// Samples [begin, begin + length) of `batch`: every input and the target
/// narrowed along the batch dimension (views, no copy).
Batch narrow_batch(const Batch& batch, int64_t begin, int64_t length);

/// `batch` on `device` (itself when it is there already); `non_blocking`
/// copies from pinned host memory without waiting.
Batch to_device(Batch batch, c10::Device device, bool non_blocking = false);

}  // namespace batchtune
