#include "batchtune/step/amp.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>

#include <algorithm>

#include "batchtune/common/error.h"
#include "batchtune/common/estimate.h"
#include "batchtune/common/interleaved_rounds.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/common/option.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/trial.h"
#include "batchtune/step/workload.h"
#include "memory/cuda_support.h"

namespace batchtune {
namespace {

/// A trial of a round: at least 2 timed steps after warm-up (1, and up to 5
/// while the step time still falls), filling a tenth of a second. The
/// interval comes from the rounds, so each trial needs only a median of its
/// own; a tenth of a second keeps sub-millisecond steps from being mostly
/// noise (3 steps of 1.6 ms gave speed-ups from 0.74x to 1.11x for one
/// model), and a 12x slower bf16 step still costs seconds, not minutes.
constexpr int64_t kAmpRoundSteps = 2;
constexpr int64_t kAmpRoundWarmupSteps = 1;
constexpr int64_t kAmpRoundMaxWarmupSteps = 5;
constexpr double kAmpRoundMinSeconds = 0.1;

}  // namespace

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

AmpChoice choose_cpu_amp(const std::vector<double>& speedups, int64_t batch_size,
                         bool bf16_fits) {
  if (!bf16_fits) {
    return {AmpMode::kOff,
            fmt::format("amp off: a bf16 autocast step did not fit on this CPU at batch {}, "
                        "where fp32 did",
                        batch_size),
            1.0};
  }
  if (speedups.empty()) {
    // Nothing measured (no round fitted in what was left): no "0.00x ...
    // median of 0 rounds".
    return {AmpMode::kOff,
            fmt::format("amp off: inconclusive, kept fp32: no interleaved round of fp32 and "
                        "bf16 ran at batch {}, so bf16 was not measured",
                        batch_size),
            std::nullopt};
  }
  const Estimate e = estimate_median(speedups);
  const std::string measured = fmt::format(
      "bf16 autocast ran {} the speed of fp32 on this CPU (median of {} interleaved rounds at "
      "batch {}, {} interval [{:.2f}x, {:.2f}x])",
      fmt::format("{:.2f}x", e.median), e.n, batch_size, format_level(e.level), e.low, e.high);
  if (e.level >= kConfidenceLevel && e.low >= kCpuBf16MinSpeedup) {
    return {AmpMode::kBf16, "amp bf16: " + measured, e.level};
  }
  if (e.level >= kConfidenceLevel && e.high < kCpuBf16MinSpeedup) {
    return {AmpMode::kOff,
            fmt::format("amp off: {}; bf16 needs {:.2f}x to pay here", measured,
                        kCpuBf16MinSpeedup),
            e.level};
  }
  return {AmpMode::kOff,
          fmt::format("amp off: inconclusive, kept fp32: {}; not established at {} whether "
                      "bf16 reaches {:.2f}x",
                      measured, format_level(kConfidenceLevel), kCpuBf16MinSpeedup),
          std::nullopt};
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

namespace {

/// What is wrong with training at `amp` on `device`, or nothing.
std::string amp_device_problem(AmpMode amp, c10::Device device) {
  if (amp == AmpMode::kFp16 && !device.is_cuda()) {
    return fmt::format("fp16 autocast is for CUDA devices, and this runs on {}; use bf16 or off",
                       device.str());
  }
  return {};
}

}  // namespace

void check_amp_device(AmpMode amp, c10::Device device, const std::string& what) {
  const std::string problem = amp_device_problem(amp, device);
  if (!problem.empty()) throw Error(what + ": " + problem);
}

AmpChoice resolve_amp_unmeasured(AmpMode requested, c10::Device device, FrontEnd front_end) {
  if (requested != AmpMode::kAuto) {
    const std::string problem = amp_device_problem(requested, device);
    if (!problem.empty()) throw OptionError(Option::kAmp, problem);
    return {requested, fmt::format("amp {}: {}", amp_name(requested),
                                   as_asked(Option::kAmp, front_end, {}))};
  }
  TORCH_CHECK(device.is_cuda(), "resolve_amp_unmeasured: amp auto on the CPU is measured");
  std::string reason;
  const auto gpus = cuda::devices(&reason);
  const auto index = static_cast<size_t>(device.index() < 0 ? 0 : device.index());
  if (index < gpus.size()) {
    return choose_cuda_amp(gpus[index].compute_major, gpus[index].compute_minor);
  }
  return {AmpMode::kOff, "amp off: the CUDA device could not be queried (" + reason + ")"};
}

AmpChoice choose_amp(AmpMode requested, Workload& workload, DeviceMemory& memory,
                     int64_t batch_size, FrontEnd front_end) {
  const c10::Device device = memory.device();
  if (requested != AmpMode::kAuto || device.is_cuda()) {
    return resolve_amp_unmeasured(requested, device, front_end);
  }
  TrialRunner fp32_runner(workload, memory, kDefaultMargin, AmpMode::kOff);
  TrialRunner bf16_runner(workload, memory, kDefaultMargin, AmpMode::kBf16);
  AmpMeasureOptions options;
  options.max_batch = batch_size;
  return measure_cpu_amp(fp32_runner, bf16_runner, options);
}

AmpChoice measure_cpu_amp(TrialRunner& fp32_runner, TrialRunner& bf16_runner,
                          const AmpMeasureOptions& options) {
  // Interleaved rounds, one ratio each: on a shared machine other processes
  // slow some steps down, and load that comes and goes then falls on both
  // precisions of a round alike. A single pair of medians was seen to flip
  // the decision (3.5x faster, then 1.6x slower, for the same model).
  const Clock& clock = options.clock != nullptr ? *options.clock : steady_clock();
  int64_t batch = std::max<int64_t>(1, options.max_batch);
  std::vector<double> speedups;
  const auto run = [&](TrialRunner& runner, AmpMode mode, double slice) {
    if (options.before_trial) options.before_trial(mode, batch);
    TrialResult t = runner.run(TrialOptions()
                                   .batch_size(batch)
                                   .steps(kAmpRoundSteps)
                                   .warmup_steps(kAmpRoundWarmupSteps)
                                   .max_warmup_steps(kAmpRoundMaxWarmupSteps)
                                   .min_time_s(kAmpRoundMinSeconds)
                                   .max_time_s(slice));
    if (options.after_trial) options.after_trial(t);
    return t;
  };
  RoundsOptions rounds_options;
  rounds_options.clock = &clock;
  rounds_options.deadline_s = options.deadline_s;
  rounds_options.min_rounds = kAmpMinRounds;
  rounds_options.max_rounds = kAmpMaxRounds;
  RoundsOutcome rounds;
  std::optional<RoundsOutcome> first;  // the first batch's rounds: its first round's overrun
  while (true) {
    TrialResult fp32;
    bool fitted = true;
    speedups.clear();
    rounds = run_interleaved_rounds(
        2,
        [&](size_t which, double slice) {
          if (which == 0) {
            fp32 = run(fp32_runner, AmpMode::kOff, slice);
            fitted = fp32.fits;
          } else {
            const TrialResult bf16 = run(bf16_runner, AmpMode::kBf16, slice);
            fitted = bf16.fits;
            if (fitted) speedups.push_back(fp32.step_ms / bf16.step_ms);
          }
          return fitted ? RoundTrial::kKeep : RoundTrial::kStop;
        },
        [&] {
          // Ctrl-C or SIGTERM: the caller stops after this phase (see interrupt.h).
          return interrupt_requested() ||
                 (static_cast<int64_t>(speedups.size()) >= kAmpMinRounds &&
                  choose_cpu_amp(speedups, batch).confidence.has_value());
        },
        rounds_options);
    if (!first) first = rounds;
    if (fitted) break;
    // The largest batch both fit is smaller: start again there, time allowing.
    if (batch > 1 && clock.now_s() < options.deadline_s && !interrupt_requested()) {
      batch /= 2;
      continue;
    }
    if (batch > 1) {
      speedups.clear();
      break;
    }
    if (!fp32.fits) {
      return {AmpMode::kOff,
              "amp off: the fp32 step at batch 1 did not fit, so bf16 could not be compared",
              1.0};
    }
    return choose_cpu_amp({}, batch, /*bf16_fits=*/false);
  }
  AmpChoice choice = choose_cpu_amp(speedups, batch);
  if (interrupt_requested() && !choice.confidence) {
    choice.reason += "; stopped by " + interrupt_name() + " before it could tell";
  } else if (!choice.confidence && (rounds.out_of_time || clock.now_s() >= options.deadline_s)) {
    choice.reason += "; the precision's share of the time budget ran out";
  }
  if (first && first->overrun_s > 0) {
    choice.reason += fmt::format("; its first round alone took {:.1f} s, {:.1f} s past the "
                                 "precision's share of the time budget",
                                 first->first_round_s, first->overrun_s);
  }
  return choice;
}

}  // namespace batchtune
