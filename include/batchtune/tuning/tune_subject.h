#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "batchtune/data/input_spec.h"
#include "batchtune/plan/plan.h"
#include "batchtune/step/amp.h"
#include "batchtune/step/trial.h"
#include "batchtune/tuning/noise_run.h"
#include "batchtune/tuning/plan_request.h"

namespace batchtune {

class Clock;
class Dataset;
class DeviceMemory;
class Workload;

/// What a tune measures and plans for, whoever made it: the CLI's
/// `Workload` (`WorkloadSubject`), the Python package's model (its binding's
/// adapter), a test's fake (`RunnerSubject`). The pipeline asks it for a
/// trial runner at each precision it measures or picks, and for what the
/// subject knows of itself; the optional hooks (noise run, loader tuning)
/// say when they are not there.
class TuneSubject {
 public:
  virtual ~TuneSubject() = default;

  /// The trial runner at `amp` (`kOff`, `kBf16`, `kFp16`), made when first
  /// asked for; it outlives the tune.
  virtual TrialRunner& runner(AmpMode amp) = 0;
  /// A subject of one precision (a runner made at it): that precision, and
  /// the pipeline's precision phase resolves nothing. nullopt: the pipeline
  /// resolves `TuneOptions::amp`.
  virtual std::optional<AmpChoice> own_amp() const { return std::nullopt; }
  /// The share of memory kept free its runners were made with; nullopt:
  /// `TuneOptions::margin`.
  virtual std::optional<double> own_margin() const { return std::nullopt; }
  /// Forward FLOPs per sample, for the sweep rows; nullopt where unknown.
  virtual std::optional<double> flops_per_sample() const { return std::nullopt; }
  /// The sequence lengths a batch ranges over (`int64:16..512`), for the
  /// token budget; nullopt for fixed shapes.
  virtual std::optional<LengthRange> length_range() const { return std::nullopt; }
  /// Bytes the gradients hold while micro-batches accumulate (one copy of
  /// the parameters), kept free by the token budget.
  virtual int64_t gradient_bytes() const { return 0; }
  /// The plan `request` asks for around a chosen micro-batch at `amp`.
  virtual Plan plan(const PlanRequest& request, const MicroBatchChoice& micro,
                    const AmpChoice& amp, const DeviceMemory& memory) = 0;

  /// The noise run of the goodput objective: the subject's own training
  /// loop on `data`. The default has none: the goodput objective is refused.
  virtual bool runs_noise() const { return false; }
  virtual NoiseScaleMeasurement measure_noise(DeviceMemory& memory, const Dataset& data,
                                              int64_t micro_batch, double lr, int64_t steps,
                                              uint64_t seed, double seconds, Clock* clock);
  /// The lr of its optimizer where the plan request gives none.
  virtual double default_lr() const { return 0; }

  /// Whether the loader tuning may time the input pipeline on training
  /// data, and why not where it may not.
  virtual bool tunes_loader() const { return false; }
  virtual std::string loader_skipped_note() const {
    return "loader tuning skipped: the data are synthetic";
  }
};

/// The CLI's subject: a `Workload`, its runners made on `memory` with
/// `margin` at each precision asked for, its plans recording the workload,
/// its own loop for the noise run, and loader tuning on real data.
class WorkloadSubject final : public TuneSubject {
 public:
  WorkloadSubject(Workload& workload, DeviceMemory& memory, double margin);
  ~WorkloadSubject() override;

  TrialRunner& runner(AmpMode amp) override;
  std::optional<double> flops_per_sample() const override;
  std::optional<LengthRange> length_range() const override;
  int64_t gradient_bytes() const override;
  Plan plan(const PlanRequest& request, const MicroBatchChoice& micro, const AmpChoice& amp,
            const DeviceMemory& memory) override;
  bool runs_noise() const override { return true; }
  NoiseScaleMeasurement measure_noise(DeviceMemory& memory, const Dataset& data,
                                      int64_t micro_batch, double lr, int64_t steps,
                                      uint64_t seed, double seconds, Clock* clock) override;
  double default_lr() const override;
  bool tunes_loader() const override { return true; }

 private:
  Workload& workload_;
  DeviceMemory& memory_;
  double margin_;
  std::map<AmpMode, std::unique_ptr<TrialRunner>> runners_;
};

/// Runners of one subject given by the caller (a test's fake, or one runner
/// at its own precision): `runner_at(amp)` gives each, and the plan is a
/// subject plan (no workload recorded; no noise run, no loader tuning).
class RunnerSubject final : public TuneSubject {
 public:
  /// Trial runners of one subject, one for each precision the pipeline may
  /// pick (`kOff`, `kBf16`, `kFp16`); each must outlive the tune.
  using RunnerAt = std::function<TrialRunner&(AmpMode)>;

  /// The pipeline resolves the precision over `runner_at`.
  explicit RunnerSubject(RunnerAt runner_at) : runner_at_(std::move(runner_at)) {}
  /// One runner at its own precision and margin.
  explicit RunnerSubject(TrialRunner& runner);

  TrialRunner& runner(AmpMode amp) override { return runner_at_(amp); }
  std::optional<AmpChoice> own_amp() const override { return own_amp_; }
  std::optional<double> own_margin() const override { return own_margin_; }
  Plan plan(const PlanRequest& request, const MicroBatchChoice& micro, const AmpChoice& amp,
            const DeviceMemory& memory) override;

 private:
  RunnerAt runner_at_;
  std::optional<AmpChoice> own_amp_;
  std::optional<double> own_margin_;
};

}  // namespace batchtune
