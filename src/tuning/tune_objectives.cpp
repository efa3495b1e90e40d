#include "tune_objectives.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "batchtune/common/clock.h"
#include "batchtune/common/option.h"
#include "batchtune/data/dataset.h"

namespace batchtune {
namespace {

/// The measuring run's micro-batch at most: the noise scale does not depend
/// on the batch sizes it is measured at, only its spread does, and a short
/// run at a large micro-batch would take minutes on a CPU.
constexpr int64_t kNoiseRunMaxMicroBatch = 64;
/// ... and at least this, where it fits: at micro-batches of 1 or 2 a run of
/// a few dozen steps often left the smoothed |G|² estimate negative
/// (Fashion-MNIST, mlp, 20 steps of 2 x 4), so no noise scale at all.
constexpr int64_t kNoiseRunMinMicroBatch = 8;

}  // namespace

void check_energy_readable(Objective objective, const std::string& sampler_reason) {
  if (objective != Objective::kEnergy) return;
  if (sampler_reason.find("energy") != std::string::npos &&
      sampler_reason.find("power") != std::string::npos) {
    throw OptionError(Option::kObjective,
                      fmt::format("energy: {}; use {} throughput or goodput here",
                                  energy_unavailable_note(sampler_reason),
                                  mention(Option::kObjective)));
  }
}

void apply_energy(TuneResult& result, double eta, const std::string& sampler_reason) {
  result.eta = eta;
  const bool all = !result.sweep.empty() &&
                   std::all_of(result.sweep.begin(), result.sweep.end(),
                               [](const SweepRow& r) { return r.energy_j_per_sample.has_value(); });
  result.energy_note = all ? std::string() : energy_unavailable_note(sampler_reason);
  if (result.objective == Objective::kEnergy && !result.sweep.empty()) {
    result.energy_costs = energy_costs(result.sweep, eta);
    result.selection = select_energy(result.sweep, eta, sampler_reason);
    result.selection.confidence = rows_confidence(result.sweep);
  }
}

int64_t apply_goodput(TuneResult& result, const TuneOptions& options, TuneSubject& subject,
                      DeviceMemory& memory, const Dataset& data, double seconds) {
  int64_t largest = 0;
  int64_t smallest = result.sweep.front().batch_size;
  for (const auto& row : result.sweep) {
    largest = std::max(largest, row.batch_size);
    smallest = std::min(smallest, row.batch_size);
  }
  const int64_t micro =
      std::min(std::max(result.selection.batch_size, std::min(kNoiseRunMinMicroBatch, largest)),
               kNoiseRunMaxMicroBatch);
  const double lr = options.plan().base_lr.value_or(subject.default_lr());
  // The runs stop at the noise run's share of the budget, as the phase line
  // promises; an unresolved estimate is measured again at a larger batch
  // within it.
  const Clock& clock = options.clock() != nullptr ? *options.clock() : steady_clock();
  result.noise = measure_noise_until_resolved(
      [&](int64_t micro_batch, double seconds_left) {
        return subject.measure_noise(memory, data, micro_batch, lr, options.noise_steps(),
                                     options.seed(), seconds_left, options.clock());
      },
      micro, largest, clock.now_s() + std::max(seconds, 1e-9), clock);
  result.noise_data = data.describe();
  // B0: the batch the lr belongs to, as the plan scales it; else the
  // smallest measured.
  result.goodput_base_batch = lr_base_batch(options.plan()).value_or(smallest);
  const NoiseScaleMeasurement& noise = *result.noise;
  // Unbounded noise makes every batch equally efficient: goodput is throughput.
  const double noise_scale = noise.noise_scale.value_or(std::numeric_limits<double>::infinity());
  result.goodput = goodput_candidates(result.sweep, noise_scale, result.goodput_base_batch,
                                      data.size());
  const GoodputChoice choice = select_goodput(result.goodput, noise_scale, result.goodput_base_batch);
  result.goodput_choice = choice.chosen;
  result.selection = {choice.chosen.micro_batch_size,
                      noise.noise_scale
                          ? choice.reason
                          : "goodput: " + noise.note +
                                "; without it every batch counts as equally efficient; " +
                                choice.reason,
                      rows_confidence(result.sweep), /*contenders=*/{}};
  return choice.chosen.global_batch_size;
}

}  // namespace batchtune
