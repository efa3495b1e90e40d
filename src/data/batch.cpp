#include "batchtune/data/batch.h"

namespace batchtune {

Batch narrow_batch(const Batch& batch, int64_t begin, int64_t length) {
  Batch out;
  for (const auto& input : batch.inputs) out.inputs.push_back(input.narrow(0, begin, length));
  if (batch.target.defined()) out.target = batch.target.narrow(0, begin, length);
  return out;
}

Batch to_device(Batch batch, c10::Device device, bool non_blocking) {
  for (auto& input : batch.inputs) {
    if (input.device() != device) input = input.to(device, non_blocking);
  }
  if (batch.target.defined() && batch.target.device() != device) {
    batch.target = batch.target.to(device, non_blocking);
  }
  return batch;
}

}  // namespace batchtune
