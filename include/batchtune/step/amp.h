#pragma once

#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/common/clock.h"
#include "batchtune/common/option.h"
#include "batchtune/common/precision.h"

namespace batchtune {

class DeviceMemory;
class TrialRunner;
class Workload;
struct TrialResult;

// `AmpMode`, `amp_name` and `parse_amp` are in `common/precision.h`.

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
/// On the CPU `amp auto` times bf16 against fp32 at the largest batch both
/// fit up to this one (halving from it on an out-of-memory): the ratio is
/// what matters, and a 12x slower bf16 step at a large batch would cost more
/// than the decision is worth.
constexpr int64_t kAmpProbeMaxBatch = 32;
/// Interleaved fp32 / bf16 rounds: at least enough for the interval of the
/// ratio's median to reach `kConfidenceLevel` (6 rounds: [min, max] covers
/// it with 96.9 %), and at most this many while it is still undecided.
constexpr int64_t kAmpMinRounds = 6;
constexpr int64_t kAmpMaxRounds = 12;
/// bf16 on CUDA needs Ampere (compute capability 8.0) or newer.
constexpr int kCudaBf16MinComputeMajor = 8;

/// A resolved mixed-precision mode, the sentence that explains it, and how
/// sure it is.
struct AmpChoice {
  AmpMode mode = AmpMode::kOff;
  std::string reason;
  /// The level the measurement reached; 1 where nothing was measured (asked
  /// for, by the GPU's capability, from a plan or checkpoint); nullopt:
  /// inconclusive, fp32 kept.
  std::optional<double> confidence = 1.0;
};

/// How `measure_cpu_amp` spends its time.
struct AmpMeasureOptions {
  /// The largest batch compared (halved while either precision does not fit).
  int64_t max_batch = kAmpProbeMaxBatch;
  /// Null for the steady clock. The rounds are sized to `deadline_s` (see
  /// `run_interleaved_rounds`): the first always runs, a later one only
  /// when the longest so far would end by it, each trial gets its slice of
  /// what is left, and a first round that alone outlasts it is said in the
  /// reason, with by how much.
  const Clock* clock = nullptr;
  double deadline_s = std::numeric_limits<double>::infinity();
  /// Called before every trial with its precision and batch (a reporter, a
  /// stop check that throws).
  std::function<void(AmpMode, int64_t)> before_trial;
  /// Called after every trial.
  std::function<void(const TrialResult&)> after_trial;
};

/// Resolves `requested`: anything but `auto` is kept (fp16 on a CPU is
/// refused with `batchtune::Error`, LibTorch has no CPU fp16 autocast
/// worth using). `auto` decides on CUDA by compute capability (bf16 from
/// 8.0, fp16 with a loss scaler below) and on the CPU by measurement: a
/// few alternating rounds of steps of `workload` at `batch_size` in fp32 and
/// under bf16 autocast, comparing the fastest step of each,
/// through the trial runner (so the workload is left as it was).
/// `front_end` names the amp option in the reason ("as asked with --amp")
/// and in the error.
AmpChoice choose_amp(AmpMode requested, Workload& workload, DeviceMemory& memory,
                     int64_t batch_size, FrontEnd front_end);

/// Refuses, with `batchtune::Error`, a precision `device` cannot train at:
/// fp16 off CUDA (LibTorch's CPU fp16 autocast is not offered for training).
/// `what` names where the mode came from, like "--amp" or "a plan's \"amp\"".
void check_amp_device(AmpMode amp, c10::Device device, const std::string& what);

/// `choose_amp` where nothing needs measuring: a mode asked for (fp16 on a
/// CPU refused with `batchtune::OptionError` on `Option::kAmp`), or `auto`
/// on CUDA by capability.
AmpChoice resolve_amp_unmeasured(AmpMode requested, c10::Device device, FrontEnd front_end);

/// `choose_amp`'s measurement on the CPU over any trial subject (the Python
/// package's model): interleaved rounds, each an fp32 trial through `fp32`
/// (a runner whose subject steps without autocast) and a bf16 trial through
/// `bf16` (one under bf16 autocast), at the largest batch both fit up to
/// `options.max_batch`; each round gives the ratio of the two median step
/// times, and `choose_cpu_amp` decides on their median's interval. Rounds
/// go on (up to `kAmpMaxRounds`) while that is undecided and time is left.
AmpChoice measure_cpu_amp(TrialRunner& fp32, TrialRunner& bf16,
                          const AmpMeasureOptions& options = {});

/// The pure decision behind `choose_amp` on the CPU, from the rounds'
/// speed-ups (fp32 step time over bf16 step time, one per round) at
/// `batch_size`: bf16 when the interval of their median lies at or above
/// `kCpuBf16MinSpeedup` at `kConfidenceLevel`, off when it lies below;
/// else inconclusive, fp32 kept (confidence nullopt). `bf16_fits == false`:
/// bf16 did not fit where fp32 did.
AmpChoice choose_cpu_amp(const std::vector<double>& speedups, int64_t batch_size,
                         bool bf16_fits = true);
/// The pure decision behind `choose_amp` on CUDA.
AmpChoice choose_cuda_amp(int compute_major, int compute_minor);

}  // namespace batchtune
