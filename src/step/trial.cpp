#include "batchtune/step/trial.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <exception>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/common/size.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/monitoring/machine_load.h"
#include "batchtune/step/lockstep.h"
#include "batchtune/step/trial_failure.h"
#include "batchtune/step/workload.h"
#include "step/training_snapshot.h"

namespace batchtune {
namespace {

bool is_interrupt(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Interrupted&) {
    return true;
  } catch (...) {
    return false;
  }
}

/// The message of the exception being handled.
std::string current_exception_message() {
  try {
    throw;
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace

void TrialSubject::set_sequence_length(int64_t length) {
  if (length != 0) {
    throw Error(fmt::format("{}: this trial subject takes no sequence length (asked for {})",
                            describe(), length));
  }
}

WorkloadTrial::WorkloadTrial(Workload& workload, c10::Device device, AmpMode amp)
    : workload_(workload), device_(device), amp_(amp) {}

WorkloadTrial::~WorkloadTrial() = default;

std::string WorkloadTrial::describe() const { return workload_.model().describe(); }

void WorkloadTrial::save() {
  snapshot_ = std::make_unique<TrainingSnapshot>(workload_.model(), workload_.optimizer());
}

void WorkloadTrial::prepare(int64_t batch_size) {
  batch_size_ = batch_size;
  step_ = std::make_unique<TrainingStep>(workload_, device_, StepOptions().amp(amp_));
  if (loss_scale_ && step_->scaler().enabled()) step_->scaler().load_state({*loss_scale_, 0, 0});
  last_skipped_ = false;
  batch_ = std::make_unique<Batch>(length_ > 0 ? workload_.synthetic_batch(batch_size, length_)
                                               : workload_.synthetic_batch(batch_size));
}

void WorkloadTrial::set_sequence_length(int64_t length) {
  if (length != 0) at_length(workload_.input_spec(), length);  // throws outside the range
  length_ = length;
}

int64_t WorkloadTrial::sequence_length() const {
  return length_ > 0 ? length_ : batchtune::sequence_length(workload_.input_spec());
}

void WorkloadTrial::next_batch(const BatchSource& source) {
  if (source) *batch_ = source(batch_size_);
}

at::Tensor WorkloadTrial::step() {
  TORCH_CHECK(step_ && batch_, "WorkloadTrial: prepare() before step()");
  if (!forward_only_) {
    const int64_t skipped = step_->scaler().skipped_steps();
    at::Tensor loss = step_->run(*batch_);
    last_skipped_ = step_->scaler().skipped_steps() > skipped;
    return loss;
  }
  at::NoGradGuard no_grad;
  workload_.model().train(false);
  AutocastGuard autocast(device_.type(), amp_);
  return workload_.compute_loss(*batch_);
}

bool WorkloadTrial::set_forward_only(bool on) {
  forward_only_ = on;
  return true;
}

void WorkloadTrial::restore() {
  if (forward_only_) workload_.model().train(true);  // as training left it
  batch_.reset();
  if (step_ && step_->scaler().enabled() && !forward_only_) {
    loss_scale_ = step_->scaler().current_scale();
  }
  step_.reset();
  workload_.optimizer().zero_grad(/*set_to_none=*/true);
  if (snapshot_) snapshot_->restore();
  snapshot_.reset();
}

TrialRunner::TrialRunner(Workload& workload, DeviceMemory& memory, double margin, AmpMode amp)
    : TrialRunner(std::make_unique<WorkloadTrial>(workload, workload.options().device(), amp),
                  memory, margin) {}

TrialRunner::TrialRunner(TrialSubject& subject, DeviceMemory& memory, double margin)
    : TrialRunner(nullptr, memory, margin) {
  subject_ = &subject;
}

void check_margin(double margin) {
  if (!(margin >= 0 && margin <= kMaxMargin)) {
    throw OptionError(Option::kMargin,
                      fmt::format("must be from 0 to {:g} (the share of memory kept free), got {}",
                                  kMaxMargin, margin));
  }
}

TrialRunner::TrialRunner(std::unique_ptr<TrialSubject> owned, DeviceMemory& memory,
                         double margin)
    : owned_(std::move(owned)), subject_(owned_.get()), memory_(memory), margin_(margin) {
  check_margin(margin);
  memory_.set_usable_bytes(static_cast<int64_t>(
      std::floor(static_cast<double>(memory_.capacity_bytes()) * (1 - margin_))));
}

TrialRunner::~TrialRunner() = default;

void TrialRunner::set_lockstep(Lockstep* lockstep) {
  lockstep_ = lockstep;
  subject_->set_lockstep(lockstep);
}

TrialResult TrialRunner::run(const TrialOptions& options) {
  if (options.batch_size() < 1) {
    throw OptionError(Option::kBatchSize,
                      fmt::format("must be at least 1, got {}", options.batch_size()));
  }
  if (options.steps() < 1 || options.warmup_steps() < 0) {
    throw OptionError(Option::kSteps,
                      fmt::format("need at least 1 timed step and no negative warm-up, got {} "
                                  "and {}",
                                  options.steps(), options.warmup_steps()));
  }
  TrialSubject& subject = *subject_;
  TrialResult result;
  result.batch_size = options.batch_size();
  result.amp = subject.amp();
  result.capacity_bytes = memory_.capacity_bytes();
  result.usable_bytes = memory_.usable_bytes();
  result.margin = margin_;

  if (lockstep_ != nullptr) lockstep_->begin_trial(options.batch_size());
  // An error before the steps (the subject's snapshot) or while putting it
  // back: the peers learn it at their next meeting, then it goes on up.
  const auto telling_peers = [&](const auto& work) {
    try {
      work();
    } catch (...) {
      if (lockstep_ != nullptr) lockstep_->fail(/*error=*/true);
      throw;
    }
  };
  telling_peers([&] {
    subject.set_sequence_length(options.sequence_length());
    result.sequence_length = subject.sequence_length();
    subject.save();
  });
  memory_.release_cached();
  memory_.reset_peak();
  // Whatever happens, the subject is put back and the memory released.
  const auto put_back = [&] {
    telling_peers([&] {
      subject.restore();
      memory_.release_cached();
    });
  };
  const int64_t ooms_before = memory_.oom_count();
  const Clock& clock = *clock_;
  const double trial_start = clock.now_s();
  CpuTimes load_before;
  // In lockstep, whether another step runs is the ranks' decision: warm-up
  // while any rank wants one, timed steps while all do.
  const auto agreed = [&](bool wanted, bool any) {
    return lockstep_ != nullptr ? lockstep_->another_step(wanted, any) : wanted;
  };
  try {
    subject.prepare(options.batch_size());
    const int64_t min_warmup = options.warmup_steps();
    const int64_t max_warmup = std::max(min_warmup, options.max_warmup_steps());
    double previous_s = 0;  // the step before, warm-up or timed
    double timed_s = 0;
    // Whether one more step, as long as the last, would end within `share`
    // of the slice.
    const auto room_for_a_step = [&](double share) {
      return clock.now_s() - trial_start + previous_s <= share * options.max_time_s();
    };
    const auto run_step = [&]() {
      memory_.synchronize();
      const double start = clock.now_s();
      subject.next_batch(options.batch_source());
      const double ready = clock.now_s();
      const at::Tensor loss = subject.step();
      memory_.synchronize();
      const double end = clock.now_s();
      if (result.steps_run++ == 0) {
        // A loss that is not finite from the first step is a broken workload,
        // not a size limit: stop the search rather than bound it.
        const double first = loss.item<double>();
        if (!std::isfinite(first)) {
          throw Error(fmt::format(
              "trial at batch {}: the loss is {} after the first step; this is not a size "
              "limit — check the model, the input spec and the learning rate",
              options.batch_size(), first));
        }
      }
      previous_s = end - start;
      return std::make_tuple(loss, end - start, ready - start);
    };
    double before_s = 0;
    // fp16: at least one warm-up step, and more while the scaler skips them.
    const int64_t fp16_warmup = subject.amp() == AmpMode::kFp16 ? 1 : 0;
    int64_t skipped_warmup = 0;
    while (true) {
      const bool skipping = result.warmup_steps_run > 0 && subject.last_step_skipped() &&
                            skipped_warmup < kMaxSkippedWarmupSteps;
      bool another = true;
      if (skipping) {
        ++skipped_warmup;
      } else if (result.warmup_steps_run >= std::max(max_warmup, fp16_warmup)) {
        another = false;
      } else if (result.warmup_steps_run >= std::max(min_warmup, fp16_warmup)) {
        // Settled once a step is no longer markedly faster than the one before.
        const bool settled =
            result.warmup_steps_run >= 2 && previous_s >= kSettledRatio * before_s;
        another = !settled && room_for_a_step(kWarmupSliceShare);
      }
      if (!agreed(another, /*any=*/true)) break;
      before_s = previous_s;
      run_step();
      ++result.warmup_steps_run;
    }
    load_before = read_cpu_times();
    result.timed_from_s = clock.now_s();
    at::Tensor last_loss;
    while (true) {
      const auto timed = static_cast<int64_t>(result.step_seconds.size());
      const bool another = timed < 1 || (room_for_a_step(1) &&
                                         timed < std::max(options.steps(), options.max_steps()) &&
                                         (timed < options.steps() || timed_s < options.min_time_s()));
      if (!agreed(another, /*any=*/false)) break;
      auto [loss, step_s, wait_s] = run_step();
      result.step_seconds.push_back(step_s);
      result.wait_seconds.push_back(wait_s);
      timed_s += step_s;
      last_loss = loss;
      result.timed_to_s = clock.now_s();
    }
    result.loss = last_loss.item<double>();
    result.fits = true;
  } catch (const PeerFailure& e) {
    if (!e.out_of_memory) {
      put_back();
      throw Error(e.what());
    }
    result.fits = false;
    result.failure = TrialFailure::kOutOfMemory;
    result.error = e.what();
  } catch (const c10::OutOfMemoryError& e) {
    result.fits = false;
    result.failure = TrialFailure::kOutOfMemory;
    result.error = first_line(e.what_without_backtrace());
  } catch (const c10::Error& e) {
    // Memory under another name (cuDNN's engine search, cudaMalloc outside
    // the caching allocator) or a size LibTorch refuses; else a real error.
    const StepFailure kind = classify_step_failure(e, ooms_before, memory_.oom_count());
    if (kind == StepFailure::kError) {
      put_back();
      if (lockstep_ != nullptr) lockstep_->fail(/*error=*/true);
      throw;
    }
    result.fits = false;
    result.failure =
        kind == StepFailure::kOutOfMemory ? TrialFailure::kOutOfMemory : TrialFailure::kDoesNotRun;
    result.error = first_line(e.what_without_backtrace());
  } catch (...) {
    // An error that is no c10::Error (from Python: "CUDA error: out of
    // memory" as a RuntimeError or AcceleratorError, cuDNN's failed engine
    // search) is classified as one is: the allocator's counter first, then
    // the message. Else not a size limit (a shape mismatch...): the caller
    // stops, but the subject is left as it was all the same.
    StepFailureEvidence evidence;
    evidence.message = current_exception_message();
    evidence.ooms_before = ooms_before;
    evidence.ooms_after = memory_.oom_count();
    const StepFailure kind = is_interrupt(std::current_exception())
                                 ? StepFailure::kError
                                 : classify_step_failure(evidence);
    if (kind == StepFailure::kError) {
      put_back();
      if (lockstep_ != nullptr) lockstep_->fail(/*error=*/true);
      throw;
    }
    result.fits = false;
    result.failure =
        kind == StepFailure::kOutOfMemory ? TrialFailure::kOutOfMemory : TrialFailure::kDoesNotRun;
    result.error = first_line(evidence.message);
  }
  total_steps_ += result.steps_run;
  // The peak before putting back: restoring the snapshot allocates nothing
  // on the device, but the peak belongs to the steps.
  result.peak_bytes = memory_.peak_bytes();
  const int64_t reserve_used =
      options.keep_fragmentation_reserve() ? memory_.reserve_used_bytes() : 0;
  const int64_t over_budget = memory_.over_budget_bytes() + reserve_used;
  put_back();
  // The peers learn of a failed step once its memory is given back (their
  // meeting's collective allocates on this rank too); learned from them,
  // it is not sent again.
  if (lockstep_ != nullptr && !result.fits) lockstep_->fail(/*error=*/false);

  if (result.fits && over_budget > 0) {
    result.fits = false;
    result.failure = TrialFailure::kOverBudget;
    result.error = fmt::format("peak {} is {} over the usable {} ({} less {:.0f} % margin{})",
                               format_bytes(result.peak_bytes), format_bytes(over_budget),
                               format_bytes(result.usable_bytes),
                               format_bytes(result.capacity_bytes), margin_ * 100,
                               reserve_used > 0
                                   ? fmt::format(", and {:.0f} % of the allocator's cap a "
                                                 "search keeps for its fragmentation",
                                                 kCudaFragmentationReserve * 100)
                                   : std::string());
  }
  if (lockstep_ != nullptr) {
    try {
      lockstep_->agree(result);
    } catch (const PeerFailure& e) {
      throw Error(e.what());  // a peer's error after its trial: this rank stops too
    }
  }
  summarize_steps(result);
  if (result.noisy) result.noise_cause = machine_load_cause(load_before, read_cpu_times());
  return result;
}

void summarize_steps(TrialResult& result) {
  if (result.step_seconds.empty()) return;
  std::vector<double> step_ms = result.step_seconds;
  for (double& ms : step_ms) ms *= 1e3;
  result.step_ms_ci = estimate_median(step_ms);
  result.step_ms = result.step_ms_ci.median;
  result.step_ms_spread = relative_spread(step_ms);
  result.samples_per_s_ci = result.step_ms_ci.reciprocal(1e3 * static_cast<double>(result.batch_size));
  result.samples_per_s = result.samples_per_s_ci.median;
  result.tokens_per_s = result.samples_per_s * static_cast<double>(result.sequence_length);
  result.noisy = result.step_ms_ci.noisy();
  double total = 0;
  double waiting = 0;
  for (size_t i = 0; i < result.step_seconds.size(); ++i) {
    total += result.step_seconds[i];
    waiting += result.wait_seconds[i];
  }
  result.busy = total > 0 ? (total - waiting) / total : 0;
}

}  // namespace batchtune
