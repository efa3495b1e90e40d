#include "batchtune/tuning/tune_subject.h"

#include "batchtune/common/error.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/models/model.h"
#include "batchtune/step/workload.h"

namespace batchtune {

NoiseScaleMeasurement TuneSubject::measure_noise(DeviceMemory&, const Dataset&, int64_t, double,
                                                 int64_t, uint64_t, double, Clock*) {
  throw Error("TuneSubject: this subject has no noise run (runs_noise() is false)");
}

WorkloadSubject::WorkloadSubject(Workload& workload, DeviceMemory& memory, double margin)
    : workload_(workload), memory_(memory), margin_(margin) {}

WorkloadSubject::~WorkloadSubject() = default;

TrialRunner& WorkloadSubject::runner(AmpMode amp) {
  auto& runner = runners_[amp];
  if (!runner) runner = std::make_unique<TrialRunner>(workload_, memory_, margin_, amp);
  return *runner;
}

std::optional<double> WorkloadSubject::flops_per_sample() const {
  return workload_.model().forward_flops_per_sample();
}

std::optional<LengthRange> WorkloadSubject::length_range() const {
  return batchtune::length_range(workload_.input_spec());
}

int64_t WorkloadSubject::gradient_bytes() const { return parameter_bytes(workload_.model()); }

Plan WorkloadSubject::plan(const PlanRequest& request, const MicroBatchChoice& micro,
                           const AmpChoice& amp, const DeviceMemory& memory) {
  return build_plan(request, micro, amp, workload_, memory);
}

NoiseScaleMeasurement WorkloadSubject::measure_noise(DeviceMemory& memory, const Dataset& data,
                                                     int64_t micro_batch, double lr,
                                                     int64_t steps, uint64_t seed, double seconds,
                                                     Clock* clock) {
  return measure_noise_scale(workload_, memory, data, micro_batch, lr, steps, seed, seconds,
                             clock);
}

double WorkloadSubject::default_lr() const { return workload_.options().lr(); }

RunnerSubject::RunnerSubject(TrialRunner& runner)
    : runner_at_([&runner](AmpMode) -> TrialRunner& { return runner; }),
      own_amp_(AmpChoice{runner.amp(),
                         "amp " + amp_name(runner.amp()) + ": the subject's precision", 1.0}),
      own_margin_(runner.margin()) {}

Plan RunnerSubject::plan(const PlanRequest& request, const MicroBatchChoice& micro,
                         const AmpChoice& amp, const DeviceMemory& memory) {
  return build_subject_plan(request, micro, amp, memory.device().is_cuda());
}

}  // namespace batchtune
