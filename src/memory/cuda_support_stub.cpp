// Built when LibTorch has no CUDA: batchtune runs on the CPU only.
#include <fmt/format.h>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "memory/cuda_support.h"

namespace batchtune::cuda {

bool compiled() { return false; }

std::vector<GpuInfo> devices(std::string* reason) {
  if (reason != nullptr) *reason = "this LibTorch was built without CUDA";
  return {};
}

std::string driver_version() { return {}; }

std::string pci_bus_id(int) { return {}; }

std::unique_ptr<DeviceMemory> make_memory(int index, std::optional<int64_t>) {
  throw OptionError(Option::kDevice,
                    fmt::format("cuda:{}: batchtune was built against a LibTorch without CUDA; "
                                "use cpu or rebuild against a CUDA LibTorch",
                                index));
}

void set_current_device(int) {}

at::Tensor generator_state(int) { return {}; }

void set_generator_state(int, const at::Tensor&) {}

}  // namespace batchtune::cuda
