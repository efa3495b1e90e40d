// A TorchScript module loaded from a file, seen as a batchtune Model.
#include "batchtune/models/script_model.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/script.h>

#include <sstream>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/common/file_roles.h"
#include "batchtune/data/input_spec.h"

namespace batchtune {
namespace {

// Graph executor optimisation (the profiling executor's fusion and
// specialisation), measured for training with LibTorch 2.11 on this
// project's CPU machines: 1 thread, Adam, median CPU time per step after 3
// warm-up steps, two runs each, optimisation off -> on:
//   scripted transformer layer (width 128, T 128, batch 8)  27-30 -> 40-41 ms
//   scripted MLP 3072-512-512-10, batch 256                 34-36 -> 35-36 ms
//   scripted conv net with batch norm, batch 32             70    -> 64-77 ms
//   traced conv net, batch 32                               65-67 -> 70 ms
// Off is never slower and a third faster on attention, so training runs with
// it off unless `ScriptModelOptions::optimize_graph` asks for it.

/// Sets the graph executor's optimisation flag (thread-local in LibTorch) for
/// one forward, and puts the old value back.
class GraphOptimizeGuard {
 public:
  explicit GraphOptimizeGuard(bool on) : previous_(torch::jit::getGraphExecutorOptimize()) {
    torch::jit::setGraphExecutorOptimize(on);
  }
  ~GraphOptimizeGuard() { torch::jit::setGraphExecutorOptimize(previous_); }
  GraphOptimizeGuard(const GraphOptimizeGuard&) = delete;
  GraphOptimizeGuard& operator=(const GraphOptimizeGuard&) = delete;

 private:
  bool previous_;
};

/// LibTorch's own reason from an error the TorchScript interpreter wrapped:
/// the line after its traceback ("RuntimeError: mat1 and mat2 shapes ..."),
/// else the first line.
std::string reason(const std::string& message) {
  for (const char* marker : {"RuntimeError: ", "Error: "}) {
    const size_t at = message.rfind(marker);
    if (at != std::string::npos) {
      const size_t start = at + std::string(marker).size();
      return message.substr(start, message.find('\n', start) - start);
    }
  }
  return message.substr(0, message.find('\n'));
}

bool mentions_out_of_memory(const std::string& message) {
  return message.find("out of memory") != std::string::npos ||
         message.find("OutOfMemoryError") != std::string::npos;
}

std::string describe_tensors(const std::vector<at::Tensor>& tensors) {
  std::vector<std::string> parts;
  for (const auto& t : tensors) {
    parts.push_back(fmt::format("{}[{}]", dtype_name(t.scalar_type()), fmt::join(t.sizes(), ", ")));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

/// The tensor a forward's result stands for.
at::Tensor output_tensor(const c10::IValue& result, const std::string& path) {
  if (result.isTensor()) return result.toTensor();
  if (result.isTuple() || result.isList()) {
    const auto elements = result.isTuple() ? result.toTupleRef().elements().vec()
                                           : result.toListRef().vec();
    if (!elements.empty() && elements.front().isTensor()) return elements.front().toTensor();
  }
  if (result.isGenericDict()) {
    const auto dict = result.toGenericDict();
    for (const char* key : {"loss", "logits"}) {
      const auto it = dict.find(c10::IValue(std::string(key)));
      if (it != dict.end() && it->value().isTensor()) return it->value().toTensor();
    }
  }
  throw OptionError(Option::kModel, path,
                    fmt::format("forward returned {}; batchtune needs a tensor, a tuple whose "
                                "first element is one, or a dict with 'loss' or 'logits'",
                                result.tagKind()));
}

class ScriptModel final : public Model {
 public:
  ScriptModel(std::string path, torch::jit::Module module, ScriptModelOptions options)
      : path_(std::move(path)), module_(std::move(module)), options_(options) {
    const auto method = module_.find_method("forward");
    if (!method) {
      throw OptionError(Option::kModel, path_, "the module has no forward method");
    }
    std::ostringstream signature;
    signature << method->function().getSchema();
    signature_ = signature.str();
    int64_t all = 0;
    for (const auto& p : module_.parameters()) {
      ++all;
      if (p.requires_grad()) parameters_.push_back(p);
    }
    if (parameters_.empty()) {
      throw OptionError(
          Option::kModel, path_,
          fmt::format("no trainable parameters ({} parameters, none with requires_grad); save "
                      "the module before freezing it (torch.jit.freeze) and with its parameters "
                      "trainable",
                      all));
    }
    module_.train(true);
  }

  using Model::forward;
  at::Tensor forward(const std::vector<at::Tensor>& inputs) override {
    std::vector<c10::IValue> arguments(inputs.begin(), inputs.end());
    GraphOptimizeGuard optimize(options_.optimize_graph());
    c10::IValue result;
    try {
      result = module_.forward(std::move(arguments));
    } catch (const c10::OutOfMemoryError&) {
      throw;
    } catch (const std::exception& e) {
      // The interpreter re-throws errors from inside the graph as
      // std::runtime_error: out-of-memory must stay out-of-memory, so that
      // the trial runner turns it into a result.
      const std::string message = e.what();
      if (mentions_out_of_memory(message)) {
        TORCH_CHECK_WITH(OutOfMemoryError, false, reason(message));
      }
      throw OptionError(Option::kModel, path_,
                        fmt::format("{} does not accept the inputs {}: {}", signature_,
                                    describe_tensors(inputs), reason(message)));
    }
    return output_tensor(result, path_);
  }

  std::vector<at::Tensor> parameters() override {
    // Re-read: `to()` may have replaced the tensors.
    std::vector<at::Tensor> out;
    for (const auto& p : module_.parameters()) {
      if (p.requires_grad()) out.push_back(p);
    }
    return out;
  }

  std::vector<at::Tensor> buffers() override {
    std::vector<at::Tensor> out;
    for (const auto& b : module_.buffers()) out.push_back(b);
    return out;
  }

  std::vector<std::pair<std::string, at::Tensor>> named_parameters() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& p : module_.named_parameters()) {
      if (p.value.requires_grad()) out.emplace_back(p.name, p.value);
    }
    return out;
  }

  std::vector<std::pair<std::string, at::Tensor>> named_buffers() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& b : module_.named_buffers()) out.emplace_back(b.name, b.value);
    return out;
  }

  std::optional<std::string> torchscript_bytes() override {
    std::ostringstream bytes;
    module_.save(bytes);
    return bytes.str();
  }

  void train(bool on) override { module_.train(on); }
  void to(const c10::Device& device) override { module_.to(device); }

  std::string describe() const override {
    int64_t count = 0;
    for (const auto& p : module_.parameters()) count += p.numel();
    return fmt::format("{} (TorchScript, {} parameters)", path_, count);
  }

 private:
  std::string path_;
  torch::jit::Module module_;
  ScriptModelOptions options_;
  std::string signature_;
  std::vector<at::Tensor> parameters_;
};

}  // namespace

std::unique_ptr<Model> load_script_model(const std::string& path,
                                         const ScriptModelOptions& options) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw OptionError(Option::kModel, path, "no such file, and not a built-in model");
  }
  check_input_file(path, Option::kModel);
  torch::jit::Module module;
  try {
    module = torch::jit::load(path);
  } catch (const std::exception& e) {
    throw OptionError(Option::kModel, path,
                      fmt::format("not a TorchScript archive ({}); save one from Python with "
                                  "torch.jit.script(model).save(path)",
                                  reason(e.what())));
  }
  return std::make_unique<ScriptModel>(path, std::move(module), options);
}

}  // namespace batchtune
