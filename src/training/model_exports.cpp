#include "batchtune/training/model_exports.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include "batchtune/common/atomic_file.h"
#include "batchtune/models/model.h"

namespace batchtune {
namespace {

/// A state dict in the format of `torch.save`: `{name: tensor}` on the CPU.
/// As `torch::pickle_save`, but with no TorchScript type tags on the dict,
/// so that `torch.load(..., weights_only=True)` (the default) accepts it.
std::string state_dict_bytes(Model& model) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, p] : model.named_parameters()) dict.insert(name, p.detach().cpu());
  for (const auto& [name, b] : model.named_buffers()) dict.insert(name, b.detach().cpu());
  std::string pickled;
  torch::jit::Pickler pickler([&](const char* data, size_t size) { pickled.append(data, size); },
                              nullptr, nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  std::string archive;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
      archive.append(static_cast<const char*>(data), size);
      return size;
    });
    torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(),
                                       pickler.tensorData(), writer);
  }  // the writer finishes the zip when it goes
  return archive;
}

}  // namespace

void write_model_exports(const std::string& dir, Model& model) {
  // What users load: the weights by name, and a TorchScript model as one.
  write_file_atomically(dir + "/" + kModelStateFile, state_dict_bytes(model));
  if (auto script = model.torchscript_bytes()) {
    write_file_atomically(dir + "/" + kModelScriptFile, *script);
  }
}

}  // namespace batchtune
