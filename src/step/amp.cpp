#include "batchtune/step/amp.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>

#include <algorithm>

#include "batchtune/memory/device_memory.h"
#include "batchtune/common/error.h"
#include "batchtune/step/trial.h"
#include "batchtune/step/workload.h"
#include "memory/cuda_support.h"

namespace batchtune {
namespace {

/// Steps `choose_amp` times per precision on the CPU: enough for a median,
/// few enough that a 12x slower bf16 step costs seconds, not minutes.
constexpr int64_t kAmpProbeSteps = 3;
/// Alternating fp32 / bf16 rounds of those steps.
constexpr int64_t kAmpProbeRounds = 3;

}  // namespace

std::string amp_name(AmpMode mode) {
  switch (mode) {
    case AmpMode::kOff: return "off";
    case AmpMode::kBf16: return "bf16";
    case AmpMode::kFp16: return "fp16";
    case AmpMode::kAuto: return "auto";
  }
  return "off";
}

AmpMode parse_amp(const std::string& text, const std::string& what) {
  for (AmpMode mode : {AmpMode::kOff, AmpMode::kBf16, AmpMode::kFp16, AmpMode::kAuto}) {
    if (text == amp_name(mode)) return mode;
  }
  throw Error(fmt::format("{}: unknown mixed precision '{}'; use off, bf16, fp16 or auto", what,
                          text));
}

c10::ScalarType amp_dtype(AmpMode mode) {
  switch (mode) {
    case AmpMode::kBf16: return c10::ScalarType::BFloat16;
    case AmpMode::kFp16: return c10::ScalarType::Half;
    default: return c10::ScalarType::Undefined;
  }
}

AutocastGuard::AutocastGuard(c10::DeviceType device, AmpMode mode) : device_(device) {
  TORCH_CHECK(mode != AmpMode::kAuto, "AutocastGuard: resolve amp auto with choose_amp first");
  if (mode == AmpMode::kOff) return;
  active_ = true;
  previous_enabled_ = at::autocast::is_autocast_enabled(device_);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::set_autocast_dtype(device_, amp_dtype(mode));
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // Cast weights are cached while autocast is nested; drop them at the end.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_, previous_dtype_);
}

AmpChoice choose_cpu_amp(double fp32_step_ms, std::optional<double> bf16_step_ms) {
  if (!bf16_step_ms) {
    return {AmpMode::kOff, fmt::format("amp off: a bf16 autocast step did not fit on this CPU "
                                       "(fp32 step {:.1f} ms)",
                                       fp32_step_ms)};
  }
  const double speedup = fp32_step_ms / *bf16_step_ms;
  if (speedup >= kCpuBf16MinSpeedup) {
    return {AmpMode::kBf16,
            fmt::format("amp bf16: a bf16 autocast step took {:.1f} ms against {:.1f} ms in fp32 "
                        "on this CPU ({:.2f}x faster)",
                        *bf16_step_ms, fp32_step_ms, speedup)};
  }
  return {AmpMode::kOff,
          fmt::format("amp off: a bf16 autocast step took {:.1f} ms against {:.1f} ms in fp32 on "
                      "this CPU ({:.1f}x slower), so it does not pay here",
                      *bf16_step_ms, fp32_step_ms, 1 / speedup)};
}

AmpChoice choose_cuda_amp(int compute_major, int compute_minor) {
  if (compute_major >= kCudaBf16MinComputeMajor) {
    return {AmpMode::kBf16,
            fmt::format("amp bf16: the GPU (compute capability {}.{}) has native bf16, which "
                        "needs no loss scaling",
                        compute_major, compute_minor)};
  }
  return {AmpMode::kFp16,
          fmt::format("amp fp16 with a dynamic loss scaler: the GPU (compute capability {}.{}) "
                      "predates bf16 (needs {}.0)",
                      compute_major, compute_minor, kCudaBf16MinComputeMajor)};
}

AmpChoice choose_amp(AmpMode requested, Workload& workload, DeviceMemory& memory,
                     int64_t batch_size) {
  const c10::Device device = memory.device();
  if (requested != AmpMode::kAuto) {
    if (requested == AmpMode::kFp16 && device.is_cpu()) {
      throw Error("--amp fp16: fp16 autocast is for CUDA devices; on the CPU use bf16 or off");
    }
    return {requested, fmt::format("amp {}: as asked with --amp", amp_name(requested))};
  }
  if (device.is_cuda()) {
    std::string reason;
    const auto gpus = cuda::devices(&reason);
    const auto index = static_cast<size_t>(device.index() < 0 ? 0 : device.index());
    if (index < gpus.size()) {
      return choose_cuda_amp(gpus[index].compute_major, gpus[index].compute_minor);
    }
    return {AmpMode::kOff, "amp off: the CUDA device could not be queried (" + reason + ")"};
  }
  TrialRunner fp32_runner(workload, memory, kDefaultMargin, AmpMode::kOff);
  TrialRunner bf16_runner(workload, memory, kDefaultMargin, AmpMode::kBf16);
  return measure_cpu_amp(fp32_runner, bf16_runner, batch_size);
}

AmpChoice measure_cpu_amp(TrialRunner& fp32_runner, TrialRunner& bf16_runner, int64_t batch_size) {
  // Alternating rounds, each side's fastest step: on a shared machine other
  // processes slow some steps down, and a single pair of medians was seen to
  // flip the decision (3.5x faster, then 1.6x slower, for the same model).
  const auto options = TrialOptions().batch_size(batch_size).steps(kAmpProbeSteps);
  double fp32_ms = 0;
  double bf16_ms = 0;
  for (int64_t round = 0; round < kAmpProbeRounds; ++round) {
    const TrialResult fp32 = fp32_runner.run(options);
    if (!fp32.fits) {
      return {AmpMode::kOff, "amp off: the fp32 step at batch " + std::to_string(batch_size) +
                                 " did not fit, so bf16 could not be compared"};
    }
    const TrialResult bf16 = bf16_runner.run(options);
    if (!bf16.fits) return choose_cpu_amp(fp32.step_ms, std::nullopt);
    const auto fastest = [](const TrialResult& r) {
      return *std::min_element(r.step_seconds.begin(), r.step_seconds.end()) * 1e3;
    };
    fp32_ms = round == 0 ? fastest(fp32) : std::min(fp32_ms, fastest(fp32));
    bf16_ms = round == 0 ? fastest(bf16) : std::min(bf16_ms, fastest(bf16));
  }
  return choose_cpu_amp(fp32_ms, bf16_ms);
}

}  // namespace batchtune
