#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

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
/// block must be deterministic (no dropout); state that it updates as it
/// runs (batch norm's running statistics) is named in the overload below,
/// so that a step updates it once. Without gradient mode, or where `input`
/// needs no gradient, the block simply runs.
///
/// Example:
/// ```
///   for (auto& block : blocks) {
///     x = batchtune::checkpointed([&](const at::Tensor& in) { return block(in); }, x);
///   }
/// ```
at::Tensor checkpointed(std::function<at::Tensor(const at::Tensor&)> block, const at::Tensor& input);

/// The same for a block whose forward updates `buffers` in place (batch
/// norm's running mean, variance and batch count): the recomputation leaves
/// them as the forward pass left them, so a step updates them once, as it
/// does without checkpointing. (Setting batch norm's momentum to 0 for the
/// recomputation would still count the batch twice.)
///
/// Example:
/// ```
///   x = batchtune::checkpointed([&](const at::Tensor& in) { return block(in); }, x,
///                               block->buffers());
/// ```
at::Tensor checkpointed(std::function<at::Tensor(const at::Tensor&)> block, const at::Tensor& input,
                        std::vector<at::Tensor> buffers);

}  // namespace batchtune
