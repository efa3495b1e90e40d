#include "batchtune/memory/device_memory.h"

#include <fmt/format.h>

#include <algorithm>

#include "batchtune/memory/budget_allocator.h"
#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/common/size.h"
#include "memory/cuda_support.h"

namespace batchtune {
namespace {

/// CPU memory: the emulated device is the byte budget.
class CpuBudgetMemory final : public DeviceMemory {
 public:
  CpuBudgetMemory(BudgetAllocator& budget, int64_t capacity)
      : budget_(budget), capacity_(capacity), usable_(capacity) {
    budget_.set_budget(usable_);
  }

  c10::Device device() const override { return c10::Device(c10::kCPU); }
  int64_t capacity_bytes() const override { return capacity_; }
  void set_usable_bytes(int64_t bytes) override {
    usable_ = std::min(bytes, capacity_);
    budget_.set_budget(usable_);
  }
  int64_t usable_bytes() const override { return usable_; }
  int64_t live_bytes() const override { return budget_.live_bytes(); }
  int64_t peak_bytes() const override { return budget_.peak_bytes(); }
  void reset_peak() override { budget_.reset_peak(); }
  int64_t oom_count() const override { return budget_.oom_count(); }
  void release_cached() override { budget_.release_cached(); }
  void synchronize() override {}
  std::string summary() const override {
    return fmt::format(
        "cpu budget allocator\n  live      {}\n  peak      {}\n  cached    {}\n"
        "  budget    {} (capacity {})\n  refused   {} allocation(s)",
        format_bytes(budget_.live_bytes()), format_bytes(budget_.peak_bytes()),
        format_bytes(budget_.cached_bytes()), format_bytes(usable_),
        format_bytes(capacity_), budget_.oom_count());
  }

 private:
  BudgetAllocator& budget_;
  int64_t capacity_;
  int64_t usable_;
};

}  // namespace

std::unique_ptr<DeviceMemory> make_device_memory(const c10::Device& device,
                                                 std::optional<int64_t> limit) {
  if (device.is_cuda()) return cuda::make_memory(device.index() < 0 ? 0 : device.index(), limit);
  if (!device.is_cpu()) {
    throw OptionError(Option::kDevice,
                      fmt::format("'{}' is not supported; use cpu or cuda[:N]", device.str()));
  }
  BudgetAllocator& budget = BudgetAllocator::install();
  const int64_t capacity = limit.value_or(static_cast<int64_t>(
      static_cast<double>(ram_available_bytes()) * kDefaultCpuBudgetFraction));
  if (budget.live_bytes() > capacity) {
    throw OptionError(Option::kMemoryLimit,
                      fmt::format("{} is less than the {} already in use before any trial; give a "
                                  "larger {}",
                                  format_bytes(capacity), format_bytes(budget.live_bytes()),
                                  mention(Option::kMemoryLimit)));
  }
  return std::make_unique<CpuBudgetMemory>(budget, capacity);
}

c10::Device parse_device(const std::string& text) {
  std::string reason;
  if (text == "auto") {
    return cuda::devices(&reason).empty() ? c10::Device(c10::kCPU)
                                          : c10::Device(c10::kCUDA, 0);
  }
  if (text == "cpu") return c10::Device(c10::kCPU);
  int index = 0;
  if (text == "cuda") {
    index = 0;
  } else if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() < 9 &&
             text.find_first_not_of("0123456789", 5) == std::string::npos) {
    index = std::stoi(text.substr(5));
  } else {
    throw OptionError(Option::kDevice,
                      fmt::format("cannot read '{}'; use auto, cpu, cuda or cuda:N", text));
  }
  const auto gpus = cuda::devices(&reason);
  if (gpus.empty()) {
    throw OptionError(Option::kDevice,
                      fmt::format("{}: no CUDA device here ({}); use cpu", text, reason));
  }
  if (index >= static_cast<int>(gpus.size())) {
    throw OptionError(Option::kDevice,
                      fmt::format("{}: there are only {} CUDA device(s), numbered from 0", text,
                                  gpus.size()));
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace batchtune
