// batchtune as a library: one trial of your own LibTorch model, in C++.
//
//   cmake --build build --target library_api && ./build/examples/library_api
//
// A project of your own finds the library with find_package(batchtune) and
// links batchtune::batchtune.
#include <batchtune/memory/budget_allocator.h>
#include <batchtune/memory/device_memory.h>
#include <batchtune/data/input_spec.h>
#include <batchtune/models/module_model.h>
#include <batchtune/step/trial.h>
#include <batchtune/step/workload.h>
#include <torch/torch.h>

#include <iostream>

namespace nn = torch::nn;

/// Your model: any torch::nn module whose forward takes one tensor.
struct TinyNetImpl : nn::Module {
  TinyNetImpl()
      : conv(register_module("conv", nn::Conv2d(nn::Conv2dOptions(1, 16, 3).padding(1)))),
        fc(register_module("fc", nn::Linear(16 * 14 * 14, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc(torch::max_pool2d(torch::relu(conv(x)), 2).flatten(1));
  }
  nn::Conv2d conv;
  nn::Linear fc;
};
TORCH_MODULE(TinyNet);

int main() {
  // On the CPU, batchtune emulates a device of fixed memory with a byte
  // budget; install its allocator before any tensor is made, so that the
  // model's own bytes count too.
  batchtune::BudgetAllocator::install();
  const c10::Device device = batchtune::parse_device("auto");  // a GPU where there is one
  // 1 GiB: a GPU that size (on CUDA the CUDA context counts towards it too).
  auto memory = batchtune::make_device_memory(device, int64_t{1} << 30);

  // What is trained: the model, one 1x28x28 float input with 10 classes
  // (cross-entropy), and Adam.
  batchtune::Workload workload(
      batchtune::WorkloadOptions()
          .model("tinynet")
          .input_spec(batchtune::classification_spec({1, 28, 28}, 10))
          .optimizer("adam")
          .lr(1e-3)
          .device(device),
      batchtune::make_module_model("tinynet", TinyNet()));

  // One trial: the real training step at a batch size, measured, leaving the
  // model and optimizer as they were.
  batchtune::TrialRunner runner(workload, *memory, batchtune::kDefaultMargin);
  for (int64_t batch_size : {64, 1 << 16}) {
    const batchtune::TrialResult r =
        runner.run(batchtune::TrialOptions().batch_size(batch_size).steps(3));
    std::cout << workload.model().describe() << ", batch " << r.batch_size << ": ";
    if (r.fits) {
      std::cout << "fits, peak " << (r.peak_bytes >> 20) << " MiB of "
                << (r.capacity_bytes >> 20) << " MiB, " << r.step_ms << " ms/step, "
                << r.samples_per_s << " samples/s, loss " << r.loss << "\n";
    } else {
      std::cout << "does not fit: " << r.error << "\n";
    }
  }
  return 0;
}
