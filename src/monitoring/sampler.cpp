// Which sampler watches which device.
#include "batchtune/monitoring/sampler.h"

#include "batchtune/memory/device_memory.h"
#include "memory/cuda_support.h"
#include "common/shared_library.h"

namespace batchtune {

std::unique_ptr<Sampler> make_sampler(const c10::Device& device) {
  if (device.is_cuda()) return make_nvml_sampler({device.has_index() ? device.index() : 0});
  return std::make_unique<ProcessCpuSampler>();
}

std::unique_ptr<Sampler> make_sampler(const std::string& device) {
  if (device == "auto") {
    std::string reason;
    const auto gpus = cuda::devices(&reason);
    if (gpus.empty()) return std::make_unique<ProcessCpuSampler>();
    std::vector<int> indices;
    for (const auto& gpu : gpus) indices.push_back(gpu.index);
    return make_nvml_sampler(indices);
  }
  return make_sampler(parse_device(device));
}

std::string gpu_unavailable_reason() {
  std::string cuda_reason;
  const bool has_gpu = !cuda::devices(&cuda_reason).empty();
  std::string nvml_reason;
  const bool has_nvml = SharedLibrary::can_open(kNvmlLibrary, &nvml_reason);
  if (has_gpu && has_nvml) return {};
  std::string reason;
  if (!has_gpu) reason = cuda_reason;
  if (!has_nvml) reason += (reason.empty() ? "" : "; ") + nvml_reason;
  return reason;
}

}  // namespace batchtune
