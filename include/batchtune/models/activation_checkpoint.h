#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace batchtune {

/// Runs `block` on `input` without keeping its activations: the backward
/// pass runs the block again and backpropagates through that recomputation
/// (activation checkpointing; LibTorch's C++ API has none, so this is
/// `torch.utils.checkpoint` with `use_reentrant=True` — the recomputed
/// block's parameters get their gradients from a backward pass of its own).
/// A step holds one block's activations at a time instead of all of them,
/// for one more forward pass of every block.
///
/// The recomputation runs under the autocast state of the forward pass. The
/// block must be deterministic (no dropout) and must not update state that a
/// second run would update again (batch norm's running statistics). Without
/// gradient mode, or where `input` needs no gradient, the block simply runs.
///
/// Example:
/// ```
///   for (auto& block : blocks) {
///     x = batchtune::checkpointed([&](const at::Tensor& in) { return block(in); }, x);
///   }
/// ```
at::Tensor checkpointed(std::function<at::Tensor(const at::Tensor&)> block, const at::Tensor& input);

}  // namespace batchtune
