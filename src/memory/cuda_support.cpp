// Built when LibTorch has CUDA. Nothing here runs on a machine without a GPU:
// `devices()` reports none, with the driver's reason.
#include "memory/cuda_support.h"

#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <mutex>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "memory/caching_allocator_memory.h"
#include "monitoring/nvml_memory.h"

namespace batchtune::cuda {
namespace {

using c10::CachingDeviceAllocator::StatType;

int device_count(std::string* reason) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    if (reason != nullptr) {
      *reason = fmt::format("no usable CUDA driver or device (cudaGetDeviceCount: {})",
                            cudaGetErrorString(status));
    }
    (void)cudaGetLastError();  // clear the error for later calls
    return 0;
  }
  if (count == 0 && reason != nullptr) *reason = "the CUDA driver reports 0 devices";
  return count;
}

/// One CUDA device, through LibTorch's caching allocator.
class CudaDevice final : public CudaDeviceApi {
 public:
  explicit CudaDevice(int index) : index_(static_cast<c10::DeviceIndex>(index)) {
    std::string reason;
    const int count = device_count(&reason);
    if (count == 0) {
      throw OptionError(Option::kDevice,
                        fmt::format("cuda:{}: no CUDA device here ({}); use cpu", index, reason));
    }
    if (index < 0 || index >= count) {
      throw OptionError(Option::kDevice,
                        fmt::format("cuda:{}: there are only {} CUDA device(s), numbered from 0",
                                    index, count));
    }
    // LibTorch's CUDA state, the caching allocator's per-device state
    // included, is made with the first CUDA tensor; until then the allocator
    // refuses setMemoryFraction and its statistics ("Allocator not
    // initialized for device"). A library user may make the memory first.
    at::globalContext().lazyInitDevice(c10::kCUDA);
    total_ = static_cast<int64_t>(at::cuda::getDeviceProperties(index_)->totalGlobalMem);
  }

  int index() const override { return index_; }
  int64_t total_bytes() const override { return total_; }
  int64_t used_bytes() const override {
    c10::cuda::CUDAGuard guard(index_);
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return static_cast<int64_t>(total_bytes) - static_cast<int64_t>(free_bytes);
  }
  AllocatorStats stats() const override {
    const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(index_);
    const auto agg = static_cast<size_t>(StatType::AGGREGATE);
    AllocatorStats out;
    out.allocated_current = s.allocated_bytes[agg].current;
    out.allocated_peak = s.allocated_bytes[agg].peak;
    out.reserved_current = s.reserved_bytes[agg].current;
    out.reserved_peak = s.reserved_bytes[agg].peak;
    out.num_ooms = s.num_ooms;
    out.num_alloc_retries = s.num_alloc_retries;
    return out;
  }
  void set_memory_fraction(double fraction) override {
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, index_);
  }
  double memory_fraction() const override {
    return c10::cuda::CUDACachingAllocator::getMemoryFraction(index_);
  }
  int current_device() const override { return c10::cuda::current_device(); }
  void set_current_device(int index, bool restore) override {
    const auto device = static_cast<c10::DeviceIndex>(index);
    if (restore) {
      // Only where that device has a context; else LibTorch makes it current
      // when it first needs it (a DDP rank never gets one on GPU 0).
      C10_CUDA_CHECK(c10::cuda::MaybeSetDevice(device));
    } else {
      c10::cuda::set_device(device);
    }
  }
  void reset_peak_stats() override {
    c10::cuda::CUDACachingAllocator::resetPeakStats(index_);
  }
  void empty_cache() override { c10::cuda::CUDACachingAllocator::emptyCache(); }
  void synchronize() override {
    // device_synchronize() waits on the current device: make it this one.
    c10::cuda::CUDAGuard guard(index_);
    c10::cuda::device_synchronize();
  }

 private:
  c10::DeviceIndex index_;
  int64_t total_ = 0;
};

}  // namespace

bool compiled() { return true; }

std::vector<GpuInfo> devices(std::string* reason) {
  const int count = device_count(reason);
  std::vector<GpuInfo> gpus;
  std::vector<std::string> bus_ids;
  for (int i = 0; i < count; ++i) {
    // Device properties and PCI ids come from the driver without a context;
    // cudaMemGetInfo would make one on every GPU (hundreds of MiB each).
    cudaDeviceProp prop{};
    C10_CUDA_CHECK(cudaGetDeviceProperties(&prop, i));
    GpuInfo gpu;
    gpu.index = i;
    gpu.name = prop.name;
    gpu.total_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    gpu.compute_major = prop.major;
    gpu.compute_minor = prop.minor;
    gpus.push_back(gpu);
    bus_ids.push_back(pci_bus_id(i));
  }
  const auto free = nvml_free_bytes(bus_ids);
  for (size_t i = 0; i < gpus.size(); ++i) gpus[i].free_bytes = free[i];
  return gpus;
}

std::string pci_bus_id(int index) {
  char id[32] = {};
  if (cudaDeviceGetPCIBusId(id, sizeof(id), index) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  return id;
}

std::string driver_version() {
  int version = 0;
  if (cudaDriverGetVersion(&version) != cudaSuccess || version == 0) return {};
  return fmt::format("{}.{}", version / 1000, (version % 1000) / 10);
}

std::unique_ptr<DeviceMemory> make_memory(int index, std::optional<int64_t> limit) {
  return make_caching_allocator_memory(std::make_unique<CudaDevice>(index), limit);
}

void set_current_device(int index) { c10::cuda::set_device(static_cast<c10::DeviceIndex>(index)); }

at::Tensor generator_state(int index) {
  auto generator = at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(index));
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_generator_state(int index, const at::Tensor& state) {
  auto generator = at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(index));
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

}  // namespace batchtune::cuda
