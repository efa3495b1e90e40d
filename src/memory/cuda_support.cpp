// Built when LibTorch has CUDA. Nothing here runs on a machine without a GPU:
// `devices()` reports none, with the driver's reason.
#include "memory/cuda_support.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>

#include "batchtune/common/error.h"
#include "batchtune/common/size.h"

namespace batchtune::cuda {
namespace {

using c10::CachingDeviceAllocator::StatType;

class CudaMemory final : public DeviceMemory {
 public:
  CudaMemory(int index, std::optional<int64_t> limit) : index_(index) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index_));
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    total_ = static_cast<int64_t>(total_bytes);
    capacity_ = std::min<int64_t>(limit.value_or(total_), total_);
    set_usable_bytes(capacity_);
  }

  c10::Device device() const override {
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index_));
  }
  int64_t capacity_bytes() const override { return capacity_; }
  void set_usable_bytes(int64_t bytes) override {
    usable_ = std::min(bytes, capacity_);
    // The caching allocator then raises a real out-of-memory at the usable
    // budget, exactly as a smaller GPU would.
    c10::cuda::CUDACachingAllocator::setMemoryFraction(
        static_cast<double>(usable_) / static_cast<double>(total_),
        static_cast<c10::DeviceIndex>(index_));
  }
  int64_t usable_bytes() const override { return usable_; }
  int64_t live_bytes() const override {
    return stats().allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].current;
  }
  int64_t peak_bytes() const override {
    return stats().reserved_bytes[static_cast<size_t>(StatType::AGGREGATE)].peak;
  }
  void reset_peak() override {
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index_));
  }
  void release_cached() override { c10::cuda::CUDACachingAllocator::emptyCache(); }
  void synchronize() override {
    c10::cuda::device_synchronize();
  }
  std::string summary() const override {
    const auto s = stats();
    const auto agg = static_cast<size_t>(StatType::AGGREGATE);
    return fmt::format(
        "cuda:{} caching allocator\n  allocated {} (peak {})\n  reserved  {} (peak {})\n"
        "  usable    {} of {}\n  out-of-memory events {}, cudaMalloc retries {}",
        index_, format_bytes(s.allocated_bytes[agg].current),
        format_bytes(s.allocated_bytes[agg].peak), format_bytes(s.reserved_bytes[agg].current),
        format_bytes(s.reserved_bytes[agg].peak), format_bytes(usable_),
        format_bytes(capacity_), s.num_ooms, s.num_alloc_retries);
  }

 private:
  c10::CachingDeviceAllocator::DeviceStats stats() const {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(
        static_cast<c10::DeviceIndex>(index_));
  }

  int index_;
  int64_t total_ = 0;
  int64_t capacity_ = 0;
  int64_t usable_ = 0;
};

}  // namespace

bool compiled() { return true; }

std::vector<GpuInfo> devices(std::string* reason) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    if (reason != nullptr) {
      *reason = fmt::format("no usable CUDA driver or device (cudaGetDeviceCount: {})",
                            cudaGetErrorString(status));
    }
    (void)cudaGetLastError();  // clear the sticky error for later calls
    return {};
  }
  if (count == 0 && reason != nullptr) *reason = "the CUDA driver reports 0 devices";
  std::vector<GpuInfo> gpus;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    C10_CUDA_CHECK(cudaGetDeviceProperties(&prop, i));
    GpuInfo gpu;
    gpu.index = i;
    gpu.name = prop.name;
    gpu.total_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    gpu.compute_major = prop.major;
    gpu.compute_minor = prop.minor;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(i));
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      gpu.free_bytes = static_cast<int64_t>(free_bytes);
    }
    gpus.push_back(gpu);
  }
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
  return std::make_unique<CudaMemory>(index, limit);
}

}  // namespace batchtune::cuda
