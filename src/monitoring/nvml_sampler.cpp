// GPU sampling through NVML, loaded with dlopen so that batchtune builds and
// runs where there is no NVIDIA driver; there it reports why instead.
#include <fmt/format.h>

#include <stdexcept>

#include "batchtune/monitoring/sampler.h"
#include "memory/cuda_support.h"
#include "monitoring/nvml_api.h"
#include "monitoring/nvml_memory.h"
#include "common/shared_library.h"

namespace batchtune {
namespace {

std::string cuda_label(int index) { return fmt::format("cuda:{}", index); }

class NvmlSampler final : public Sampler {
 public:
  NvmlSampler(const std::vector<int>& cuda_indices, const std::string& library, Clock& clock)
      : library_name_(library),
        library_(library),
        clock_(clock),
        init_(library_.symbol<nvml::InitFn>("nvmlInit_v2")),
        shutdown_(library_.symbol<nvml::ShutdownFn>("nvmlShutdown")),
        error_string_(library_.symbol<nvml::ErrorStringFn>("nvmlErrorString")),
        get_count_(library_.symbol<nvml::DeviceGetCountFn>("nvmlDeviceGetCount_v2")),
        get_by_index_(
            library_.symbol<nvml::DeviceGetHandleByIndexFn>("nvmlDeviceGetHandleByIndex_v2")),
        get_by_bus_id_(library_.symbol<nvml::DeviceGetHandleByPciBusIdFn>(
            "nvmlDeviceGetHandleByPciBusId_v2")),
        get_utilization_(library_.symbol<nvml::DeviceGetUtilizationRatesFn>(
            "nvmlDeviceGetUtilizationRates")),
        get_memory_(library_.symbol<nvml::DeviceGetMemoryInfoFn>("nvmlDeviceGetMemoryInfo")),
        get_memory_v2_(library_.optional_symbol<nvml::DeviceGetMemoryInfoV2Fn>(
            "nvmlDeviceGetMemoryInfo_v2")),
        get_power_(library_.symbol<nvml::DeviceGetPowerUsageFn>("nvmlDeviceGetPowerUsage")),
        get_energy_(library_.symbol<nvml::DeviceGetTotalEnergyConsumptionFn>(
            "nvmlDeviceGetTotalEnergyConsumption")) {
    check(init_(), "nvmlInit_v2");
    try {
      unsigned int count = 0;
      check(get_count_(&count), "nvmlDeviceGetCount_v2");
      for (int index : cuda_indices) devices_.push_back(find_device(index, count));
      find_unavailable_fields();
    } catch (...) {
      shutdown_();  // no destructor runs for a constructor that throws
      throw;
    }
  }

  ~NvmlSampler() override { shutdown_(); }

  std::vector<Sample> read() override {
    std::vector<Sample> samples;
    const double now = clock_.now_s();
    for (const auto& device : devices_) {
      Sample sample;
      sample.time_s = now;
      sample.device = device.label;
      nvml::Utilization utilization{};
      if (get_utilization_(device.handle, &utilization) == nvml::kSuccess) {
        sample.utilization_percent = utilization.gpu;
      }
      NvmlMemoryReading memory;
      if (read_nvml_memory(device.handle, get_memory_v2_, get_memory_, &memory) == nvml::kSuccess) {
        sample.memory_used_bytes = memory.used;
      }
      unsigned int milliwatts = 0;
      if (get_power_(device.handle, &milliwatts) == nvml::kSuccess) {
        sample.power_watts = milliwatts * 1e-3;
      }
      unsigned long long millijoules = 0;
      if (get_energy_(device.handle, &millijoules) == nvml::kSuccess) {
        sample.energy_joules = static_cast<double>(millijoules) * 1e-3;
      }
      samples.push_back(std::move(sample));
    }
    return samples;
  }

  std::string describe() const override {
    std::string labels;
    for (const auto& device : devices_) {
      labels += (labels.empty() ? "" : ", ") + device.label + " (" + device.found_by + ")";
    }
    return fmt::format("NVML ({}): {}", library_name_, labels);
  }

  std::string unavailable_reason() const override { return reason_; }

 private:
  struct Watched {
    std::string label;
    std::string found_by;  ///< how the CUDA device was matched to NVML's
    nvml::Device handle = nullptr;
  };

  std::string error_text(nvml::Return rc) const {
    const char* text = error_string_(rc);
    return text != nullptr ? text : fmt::format("NVML error {}", rc);
  }

  void check(nvml::Return rc, const char* function) const {
    if (rc != nvml::kSuccess) {
      throw std::runtime_error(
          fmt::format("{}: {} failed: {}", library_name_, function, error_text(rc)));
    }
  }

  Watched find_device(int cuda_index, unsigned int nvml_count) const {
    Watched device;
    device.label = cuda_label(cuda_index);
    // CUDA numbers the devices this process may see (CUDA_VISIBLE_DEVICES);
    // NVML numbers every device on the machine. The PCI bus id is common.
    const std::string bus_id = cuda::pci_bus_id(cuda_index);
    if (!bus_id.empty()) {
      check(get_by_bus_id_(bus_id.c_str(), &device.handle), "nvmlDeviceGetHandleByPciBusId_v2");
      device.found_by = "PCI " + bus_id;
      return device;
    }
    if (cuda_index < 0 || static_cast<unsigned int>(cuda_index) >= nvml_count) {
      throw std::runtime_error(fmt::format("{}: no device {} (NVML sees {})", library_name_,
                                           device.label, nvml_count));
    }
    check(get_by_index_(static_cast<unsigned int>(cuda_index), &device.handle),
          "nvmlDeviceGetHandleByIndex_v2");
    device.found_by = fmt::format("NVML index {}", cuda_index);
    return device;
  }

  // Reads each field once: a field NVML does not support on a device (MIG
  // instances have no utilization, older GPUs no energy counter) is named
  // with NVML's reason, once, up front.
  void find_unavailable_fields() {
    for (const auto& device : devices_) {
      nvml::Utilization utilization{};
      NvmlMemoryReading memory;
      unsigned int milliwatts = 0;
      unsigned long long millijoules = 0;
      note("utilization", "nvmlDeviceGetUtilizationRates", device,
           get_utilization_(device.handle, &utilization));
      note("memory", get_memory_v2_ != nullptr ? "nvmlDeviceGetMemoryInfo_v2" : "nvmlDeviceGetMemoryInfo",
           device, read_nvml_memory(device.handle, get_memory_v2_, get_memory_, &memory));
      note("power", "nvmlDeviceGetPowerUsage", device, get_power_(device.handle, &milliwatts));
      note("energy", "nvmlDeviceGetTotalEnergyConsumption", device,
           get_energy_(device.handle, &millijoules));
    }
  }

  void note(const char* field, const char* function, const Watched& device, nvml::Return rc) {
    if (rc == nvml::kSuccess) return;
    if (!reason_.empty()) reason_ += "; ";
    reason_ += fmt::format("{} on {}: {} says {}", field, device.label, function, error_text(rc));
  }

  std::string library_name_;
  SharedLibrary library_;
  Clock& clock_;
  nvml::InitFn init_;
  nvml::ShutdownFn shutdown_;
  nvml::ErrorStringFn error_string_;
  nvml::DeviceGetCountFn get_count_;
  nvml::DeviceGetHandleByIndexFn get_by_index_;
  nvml::DeviceGetHandleByPciBusIdFn get_by_bus_id_;
  nvml::DeviceGetUtilizationRatesFn get_utilization_;
  nvml::DeviceGetMemoryInfoFn get_memory_;
  nvml::DeviceGetMemoryInfoV2Fn get_memory_v2_;  // null before driver R510
  nvml::DeviceGetPowerUsageFn get_power_;
  nvml::DeviceGetTotalEnergyConsumptionFn get_energy_;
  std::vector<Watched> devices_;
  std::string reason_;
};

/// Stands in for NVML where it cannot be used: the devices are listed, every
/// field is empty, and the reason says why.
class UnavailableSampler final : public Sampler {
 public:
  UnavailableSampler(const std::vector<int>& cuda_indices, std::string reason, Clock& clock)
      : reason_(std::move(reason)), clock_(clock) {
    for (int index : cuda_indices) labels_.push_back(cuda_label(index));
  }

  std::vector<Sample> read() override {
    std::vector<Sample> samples;
    const double now = clock_.now_s();
    for (const auto& label : labels_) {
      Sample sample;
      sample.time_s = now;
      sample.device = label;
      samples.push_back(std::move(sample));
    }
    return samples;
  }

  std::string describe() const override {
    std::string labels;
    for (const auto& label : labels_) labels += (labels.empty() ? "" : ", ") + label;
    return "no sampler for " + labels;
  }

  std::string unavailable_reason() const override { return reason_; }

 private:
  std::vector<std::string> labels_;
  std::string reason_;
  Clock& clock_;
};

}  // namespace

nvml::Return read_nvml_memory(nvml::Device device, nvml::DeviceGetMemoryInfoV2Fn v2,
                              nvml::DeviceGetMemoryInfoFn v1, NvmlMemoryReading* out) {
  if (v2 != nullptr) {
    nvml::MemoryV2 memory{};
    memory.version = nvml::kMemoryV2Version;
    const nvml::Return rc = v2(device, &memory);
    if (rc == nvml::kSuccess) {
      *out = {static_cast<int64_t>(memory.total), static_cast<int64_t>(memory.free),
              static_cast<int64_t>(memory.used)};
      return rc;
    }
    // An older driver that exports the symbol but not this version of the
    // struct, or a device without it: version 1 still answers.
    if (rc != nvml::kErrorArgumentVersionMismatch && rc != nvml::kErrorNotSupported &&
        rc != nvml::kErrorFunctionNotFound) {
      return rc;
    }
  }
  nvml::Memory memory{};
  const nvml::Return rc = v1(device, &memory);
  if (rc == nvml::kSuccess) {
    *out = {static_cast<int64_t>(memory.total), static_cast<int64_t>(memory.free),
            static_cast<int64_t>(memory.used)};
  }
  return rc;
}

std::vector<std::optional<int64_t>> nvml_free_bytes(const std::vector<std::string>& pci_bus_ids) {
  std::vector<std::optional<int64_t>> free(pci_bus_ids.size());
  if (pci_bus_ids.empty()) return free;
  try {
    SharedLibrary library(kNvmlLibrary);
    const auto init = library.symbol<nvml::InitFn>("nvmlInit_v2");
    const auto shutdown = library.symbol<nvml::ShutdownFn>("nvmlShutdown");
    const auto by_bus_id =
        library.symbol<nvml::DeviceGetHandleByPciBusIdFn>("nvmlDeviceGetHandleByPciBusId_v2");
    const auto memory_info = library.symbol<nvml::DeviceGetMemoryInfoFn>("nvmlDeviceGetMemoryInfo");
    const auto memory_info_v2 =
        library.optional_symbol<nvml::DeviceGetMemoryInfoV2Fn>("nvmlDeviceGetMemoryInfo_v2");
    if (init() != nvml::kSuccess) return free;
    for (size_t i = 0; i < pci_bus_ids.size(); ++i) {
      nvml::Device device = nullptr;
      NvmlMemoryReading memory;
      if (!pci_bus_ids[i].empty() &&
          by_bus_id(pci_bus_ids[i].c_str(), &device) == nvml::kSuccess &&
          read_nvml_memory(device, memory_info_v2, memory_info, &memory) == nvml::kSuccess) {
        free[i] = memory.free;
      }
    }
    shutdown();
  } catch (const std::runtime_error&) {
    // No NVML here: the free memory stays unknown.
  }
  return free;
}

std::unique_ptr<Sampler> make_nvml_sampler(const std::vector<int>& cuda_indices,
                                           const std::string& library) {
  try {
    return std::make_unique<NvmlSampler>(cuda_indices, library, steady_clock());
  } catch (const std::runtime_error& e) {
    return std::make_unique<UnavailableSampler>(
        cuda_indices, fmt::format("utilization, memory, power, energy: {}", e.what()),
        steady_clock());
  }
}

}  // namespace batchtune
