#include "batchtune/tuning/noise_run.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <chrono>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/data/dataset.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/plan/plan.h"
#include "batchtune/step/noise_scale.h"
#include "batchtune/step/workload.h"
#include "batchtune/training/trainer.h"
#include "step/training_snapshot.h"

namespace batchtune {

NoiseScaleMeasurement measure_noise_scale(Workload& workload, DeviceMemory& memory,
                                          const Dataset& data, int64_t micro_batch, double lr,
                                          int64_t steps, uint64_t seed, double time_limit_s,
                                          const Clock* clock) {
  TORCH_CHECK(micro_batch >= 1 && steps >= 1, "measure_noise_scale: need a micro-batch and steps");
  // Never a logical batch larger than the data.
  const int64_t micro = std::min(micro_batch, data.size() / kNoiseRunAccumulation);
  if (micro < 1) {
    throw OptionError(Option::kData,
                      fmt::format("{} has too few samples to measure the noise scale (needs at "
                                  "least {}); use more data",
                                  data.describe(), kNoiseRunAccumulation));
  }
  const int64_t global = micro * kNoiseRunAccumulation;
  Plan plan = make_plan(
      PlanOptions().micro_batch_size(micro).target_batch(global).base_lr(lr).base_batch(global));
  NoiseScaleMeasurement out;
  out.small_batch = micro;
  out.big_batch = global;

  auto& optimizer = workload.optimizer();
  std::vector<double> lrs;
  for (auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
  TrainingSnapshot snapshot(workload.model(), optimizer);
  const auto start = std::chrono::steady_clock::now();
  {
    Trainer trainer(
        workload, memory, plan, data, nullptr,
        TrainOptions().steps(steps).seed(seed).log_every(0).time_limit_s(time_limit_s));
    if (clock != nullptr) trainer.set_clock(*clock);
    const TrainSummary summary = trainer.run();
    out.steps = summary.steps;
    out.noise_scale = summary.noise_scale;
    const NoiseScaleEstimator& estimator = trainer.noise_scale().estimator();
    out.measurements = estimator.measurements();
    out.gradient_sq_norm = estimator.gradient_sq_norm();
    out.trace_covariance = estimator.trace_covariance();
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  snapshot.restore();
  for (size_t i = 0; i < lrs.size(); ++i) optimizer.param_groups()[i].options().set_lr(lrs[i]);
  memory.release_cached();
  // A run a signal stopped is no measurement: the caller marks its run incomplete.
  throw_if_interrupted();
  if (!out.noise_scale) {
    out.note = out.measurements == 0
                   ? "no measurement was made"
                   : fmt::format("the smoothed |G|² after {} measurements is not positive "
                                 "({:.3g}): the gradient is indistinguishable from its noise "
                                 "(random labels?), so the noise scale is unbounded",
                                 out.measurements, out.gradient_sq_norm.value_or(0));
  }
  return out;
}

}  // namespace batchtune
