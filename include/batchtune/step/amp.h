#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>

namespace batchtune {

class DeviceMemory;
class TrialRunner;
class Workload;

/// Mixed precision of a plan. `kAuto` is only ever asked for: `choose_amp`
/// turns it into one of the other three before a plan holds it.
enum class AmpMode { kOff, kBf16, kFp16, kAuto };

/// `off`, `bf16`, `fp16`, `auto`.
std::string amp_name(AmpMode mode);
/// Parses `off|bf16|fp16|auto`; throws `batchtune::Error` naming `what`.
AmpMode parse_amp(const std::string& text, const std::string& what = "--amp");
/// The autocast dtype of a mode (`kBFloat16`, `kHalf`); undefined for off.
c10::ScalarType amp_dtype(AmpMode mode);

/// Autocast for the lifetime of the guard: LibTorch's C++ API has the
/// switches (`at::autocast::set_autocast_enabled(device, on)`, the dtype, a
/// nesting count) but no guard. On leaving the outermost guard the cast
/// cache is cleared, as Python's `torch.autocast` does. `kOff` does nothing.
///
/// Example:
/// ```
///   {
///     batchtune::AutocastGuard autocast(c10::kCUDA, batchtune::AmpMode::kBf16);
///     at::Tensor loss = workload.compute_loss(batch);
///   }
///   loss.backward();  // outside autocast, as recommended
/// ```
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, AmpMode mode);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_;
  bool previous_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::Undefined;
};

/// On a CPU, bf16 autocast is chosen only when a measured step is at least
/// this much faster than fp32: on this project's AVX2 machines it was ~12x
/// slower, and a marginal gain is not worth the lost precision.
constexpr double kCpuBf16MinSpeedup = 1.10;
/// On the CPU `amp auto` times bf16 against fp32 at this micro-batch at
/// most: the ratio is what matters, and a 12x slower bf16 step at a large
/// batch would cost more than the decision is worth.
constexpr int64_t kAmpProbeMaxBatch = 32;
/// bf16 on CUDA needs Ampere (compute capability 8.0) or newer.
constexpr int kCudaBf16MinComputeMajor = 8;

/// A resolved mixed-precision mode and the sentence that explains it.
struct AmpChoice {
  AmpMode mode = AmpMode::kOff;
  std::string reason;
};

/// Resolves `requested`: anything but `auto` is kept (fp16 on a CPU is
/// refused with `batchtune::Error`, LibTorch has no CPU fp16 autocast
/// worth using). `auto` decides on CUDA by compute capability (bf16 from
/// 8.0, fp16 with a loss scaler below) and on the CPU by measurement: a
/// few alternating rounds of steps of `workload` at `batch_size` in fp32 and
/// under bf16 autocast, comparing the fastest step of each,
/// through the trial runner (so the workload is left as it was).
AmpChoice choose_amp(AmpMode requested, Workload& workload, DeviceMemory& memory,
                     int64_t batch_size);

/// `choose_amp`'s measurement on the CPU over any trial subject (the Python
/// package's model): alternating rounds of steps at `batch_size` through
/// `fp32` (a runner whose subject steps without autocast) and `bf16` (one
/// whose subject steps under bf16 autocast), each side's fastest step.
AmpChoice measure_cpu_amp(TrialRunner& fp32, TrialRunner& bf16, int64_t batch_size);

/// The pure decision behind `choose_amp` on the CPU, from measured step
/// times (ms); a bf16 step that did not fit is passed as nullopt.
AmpChoice choose_cpu_amp(double fp32_step_ms, std::optional<double> bf16_step_ms);
/// The pure decision behind `choose_amp` on CUDA.
AmpChoice choose_cuda_amp(int compute_major, int compute_minor);

}  // namespace batchtune
