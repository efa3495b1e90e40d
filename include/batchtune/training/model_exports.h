#pragma once

#include <string>

namespace batchtune {

class Model;

/// Files a checkpoint directory holds besides `kCheckpointFile`: the trained
/// weights as a state dict by parameter name (what `torch.load` reads), and
/// for a TorchScript model the module itself with the trained weights.
constexpr const char* kModelStateFile = "model.pt";
constexpr const char* kModelScriptFile = "model.torchscript.pt";

/// Writes `dir/model.pt` and, for a TorchScript model,
/// `dir/model.torchscript.pt` from `model` (atomically), as
/// `write_checkpoint` does before the checkpoint itself.
///
/// Example:
/// ```
///   batchtune::write_model_exports("ckpt", model);  // torch.load("ckpt/model.pt")
/// ```
void write_model_exports(const std::string& dir, Model& model);

}  // namespace batchtune
