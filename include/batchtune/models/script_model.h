#pragma once

#include <torch/arg.h>

#include <memory>
#include <string>

#include "batchtune/models/model.h"

namespace batchtune {

/// How a TorchScript model runs.
struct ScriptModelOptions {
  /// Lets TorchScript's profiling graph executor optimise (fuse, specialise)
  /// the forward. Off by default: for training from C++ it only added time
  /// on the CPUs measured (see src/models/script_model.cpp for the figures).
  TORCH_ARG(bool, optimize_graph) = false;
};

/// Loads a TorchScript module saved from Python (`torch.jit.script(model).save(path)`
/// or `torch.jit.trace(model, example).save(path)`) as a trainable `Model`:
/// in training mode, its parameters that require gradients in a fixed order
/// (the order of `named_parameters()`), its buffers.
///
/// Its forward gets the inputs of the workload's `InputSpec` in order (and,
/// with `--loss model`, the target after them). It may return a tensor, a
/// tuple (the first element counts) or a dict (`loss`, else `logits`).
///
/// Throws `batchtune::Error` for a file that is missing or not a TorchScript
/// archive, a module with no `forward`, or one with no trainable parameters.
/// At run time, a forward that rejects its inputs becomes a `batchtune::Error`
/// that names the forward's signature, the inputs given and LibTorch's reason;
/// running out of memory inside it stays `c10::OutOfMemoryError`.
///
/// Example:
/// ```
///   auto model = batchtune::load_script_model("resnet50.pt");
///   batchtune::Workload workload(
///       batchtune::WorkloadOptions().input_spec(batchtune::classification_spec({3, 224, 224}, 1000)),
///       std::move(model));
/// ```
std::unique_ptr<Model> load_script_model(const std::string& path,
                                         const ScriptModelOptions& options = {});

}  // namespace batchtune
