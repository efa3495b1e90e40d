#include "batchtune/tuning/noise_run.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <chrono>

#include "batchtune/common/clock.h"
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
  out.micro_batches_tried = {micro};

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
    const NoiseScaleEstimator& estimator = trainer.noise_scale().estimator();
    const NoiseScaleReading reading = read_noise_scale(estimator);
    out.noise_scale = reading.noise_scale;
    out.note = reading.note;
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
  return out;
}

NoiseScaleMeasurement measure_noise_until_resolved(const NoiseRun& run, int64_t micro_batch,
                                                   int64_t max_micro_batch, double deadline_s,
                                                   const Clock& clock) {
  TORCH_CHECK(micro_batch >= 1, "measure_noise_until_resolved: need a micro-batch");
  std::vector<int64_t> tried;
  double seconds = 0;
  NoiseScaleMeasurement m;
  int64_t micro = micro_batch;
  // Why the last unresolved run was not followed by one at a larger batch.
  std::string stopped_because;
  while (true) {
    const double start = clock.now_s();
    m = run(micro, std::max(deadline_s - start, 1e-9));
    const double run_s = clock.now_s() - start;
    seconds += m.seconds;
    tried.push_back(m.small_batch);
    if (m.noise_scale || m.measurements == 0) break;
    // The run measures at less than asked where the data is small.
    if (m.small_batch < micro) {
      stopped_because =
          fmt::format("the data allows no larger micro-batch than {}", m.small_batch);
      break;
    }
    if (m.small_batch >= max_micro_batch) {
      stopped_because = fmt::format("{} is the largest micro-batch that fits", m.small_batch);
      break;
    }
    const double left = deadline_s - clock.now_s();
    if (left < kNoiseRunMinExpectedShare * kNoiseRunGrowth * run_s) {
      stopped_because = fmt::format("{:.1f} s of the noise run's share left, too little for a "
                                    "run at {} times the batch",
                                    std::max(0.0, left), kNoiseRunGrowth);
      break;
    }
    micro = std::min(micro * kNoiseRunGrowth, max_micro_batch);
  }
  if (!stopped_because.empty()) {
    m.note += fmt::format(" (measured at micro-batch {}; {})", fmt::join(tried, ", "),
                          stopped_because);
  }
  m.micro_batches_tried = std::move(tried);
  m.seconds = seconds;
  return m;
}

}  // namespace batchtune
