#include "batchtune/training/trainer.h"

#include "batchtune/training/checkpoint.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/common/option.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/amp.h"
#include "batchtune/step/workload.h"
#include "out_of_memory.h"
#include "run_options.h"
#include "sample_steps.h"

namespace batchtune {

Trainer::Trainer(Workload& workload, DeviceMemory& memory, Plan plan, const Dataset& train,
                 const Dataset* test, TrainOptions options)
    : Trainer(workload, memory, std::move(plan), test, std::move(options),
              [&](Plan& p, DataParallel& data_parallel) -> std::unique_ptr<StepSource> {
                return std::make_unique<SampleSteps>(train, workload, p, options_,
                                                     data_parallel, memory);
              }) {}

Trainer::Trainer(Workload& workload, DeviceMemory& memory, Plan plan, const Dataset* test,
                 TrainOptions options,
                 const std::function<std::unique_ptr<StepSource>(Plan&, DataParallel&)>&
                     make_source)
    : workload_(workload),
      memory_(memory),
      plan_(std::move(plan)),
      start_plan_(plan_),
      test_(test),
      options_(std::move(options)),
      training_step_(workload, memory.device(),
            StepOptions()
                .micro_batch_size(plan_.micro_batch_size)
                .amp(plan_.amp == AmpMode::kAuto ? AmpMode::kOff : plan_.amp)
                .measure_noise_scale(options_.measure_noise_scale())
                .noise_scale_every(options_.adapt() ? kAdaptNoiseEvery
                                                    : kNoiseScaleEveryWithoutAccumulation)
                .noise_from_successive_steps(options_.adapt())) {
  if (options_.clock() != nullptr) clock_ = options_.clock();
  if (plan_.amp == AmpMode::kAuto) {
    throw OptionError(Option::kAmp, "auto must be resolved before training");
  }
  // As --amp fp16 is refused on the CPU, so is a plan that says fp16 there.
  check_amp_device(plan_.amp, memory.device(), "a plan's \"amp\" (or --amp)");
  // The evaluation's options too: a run without a test split (text) refuses
  // a target accuracy.
  check_train_options(options_, test_ != nullptr);
  source_ = make_source(plan_, data_parallel_);
  if (options_.adapt()) {
    adapter_.emplace(source_->global_batch(), plan_.lr, plan_.lr_scaling, plan_.world_size,
                     source_->adapt_options());
    if (const auto cap = source_->micro_cap()) adapter_->cap_micro_batch(*cap);
  }
  if (const auto& target = options_.target_loss()) {
    loss_target_.emplace(*target, options_.loss_window());
  }
}

Trainer::~Trainer() = default;

void Trainer::settle_clock() {
  const double start = clock_->now_s();
  memory_.synchronize();
  train_seconds_ += clock_->now_s() - start;
}

std::optional<int64_t> Trainer::planned_steps() const {
  if (options_.steps() > 0) return options_.steps();
  return source_->steps_in(options_.epochs());
}

bool Trainer::finished() const {
  if (options_.steps() > 0) return step_ >= options_.steps();
  return source_->epochs_done(step_, options_.epochs());
}

void Trainer::train_step() {
  // Data parallel: the step fetched is this rank's shard of the logical
  // batch; the ranks agree on an out-of-memory, so that all shrink together.
  last_loss_tensor_ = backward_until_it_fits(
      memory_, training_step_, data_parallel_,
      [&] { return source_->backward(training_step_, step_, data_seconds_); },
      [&](const std::string& why) {
        const std::string message = source_->shrink(why, step_, training_step_);
        if (adapter_) adapter_->cap_micro_batch(*source_->micro_cap());
        ++oom_recoveries_;
        emit(TrainEvent::Kind::kOomRecovery, message);
      });
  // Data parallel: this rank's gradient against the all-reduced one is a
  // measurement of the noise scale at (local, global batch), for the price
  // of two norms on the device (McCandlish et al.'s own use of the ranks).
  const int64_t local = source_->local_samples();
  const bool measure_ranks =
      options_.measure_noise_scale() && data_parallel_.world_size() > 1 && local > 0;
  at::Tensor local_sq;
  if (measure_ranks) local_sq = squared_gradient_norm(workload_.model().parameters());
  data_parallel_.average_gradients(workload_.model().parameters(), &memory_);
  if (measure_ranks) {
    LossScaler& scaler = training_step_.scaler();
    training_step_.noise_scale().add(
        local, std::move(local_sq), local * data_parallel_.world_size(),
        squared_gradient_norm(workload_.model().parameters()),
        scaler.enabled() ? scaler.current_scale() : 1.0);
  }
  apply_or_explain(memory_, training_step_,
                   scheduled_lr(lr_at(step_), plan_.warmup_steps, step_), step_);
}

bool Trainer::reached_target_loss(double loss) {
  // Data parallel: rank 0's losses (its share of each batch) decide for all,
  // so that every rank stops after the same step.
  bool reached = loss_target_->add(loss);
  if (data_parallel_.distributed()) {
    reached = data_parallel_.sum(data_parallel_.rank() == 0 && reached ? 1 : 0) > 0;
  }
  if (!reached) return false;
  reached_ = Reached{step_, train_seconds_, samples_};
  emit(TrainEvent::Kind::kTargetReached, loss_target_->reached_message(step_, train_seconds_));
  return true;
}

void Trainer::watch_loss() {
  if (watch_steps_ == 0) return;
  const double sum = watch_loss_sum_.item<double>();
  watch_loss_sum_ = at::Tensor();
  const int64_t steps = std::exchange(watch_steps_, 0);
  if (const auto divergence = loss_watch_->observe(step_, sum, steps)) {
    emit(TrainEvent::Kind::kDivergence, divergence->note);
  }
}

TrainSummary Trainer::run() {
  total_steps_ = planned_steps();
  if (options_.resume()) {
    // A finished run's summary as it was: nothing left to train.
    if (std::optional<TrainSummary> finished = resume()) return *finished;
  }
  if (plan_.world_size != data_parallel_.world_size()) {
    throw OptionError(Option::kPlan,
                      fmt::format("world_size {} but this job has {} process(es); launch as many, "
                                  "or make the plan for this job",
                                  plan_.world_size, data_parallel_.world_size()));
  }
  // Every rank starts from rank 0's parameters and buffers.
  data_parallel_.broadcast_from_first(workload_.model().parameters());
  data_parallel_.broadcast_from_first(workload_.model().buffers());
  workload_.model().train(true);
  if (adapter_ && schedule_.empty()) {
    BatchChange start = source_->start_change();
    start.step = step_;
    start.lr = plan_.lr;
    schedule_.push_back(start);
  }
  // A resumed run starts mid-way, where a plateau is no fault: finiteness only.
  loss_watch_.emplace(start_plan_, adapter_.has_value(), /*from_start=*/step_ == 0);
  memory_.reset_peak();
  source_->start(step_, *clock_);
  // A resume's first window times from here, once its first steps settled.
  if (adapter_ && loaded_) adapter_->restart_window(train_seconds_, source_->progress());
  training_step_.set_clock(*clock_);
  epoch_ = source_->epoch_at(step_);

  bool time_limit_reached = false;
  while (!finished()) {
    const double start = clock_->now_s();
    if (before_step_) before_step_(step_);
    // A step of one micro-batch measures the noise scale now and then split
    // in two (text; an image step splits itself), unless it measures against
    // the previous step.
    const bool split_for_noise = options_.measure_noise_scale() &&
                                 !training_step_.options().noise_from_successive_steps() &&
                                 step_ % training_step_.options().noise_scale_every() == 0;
    source_->next(step_, split_for_noise, data_seconds_);
    train_step();
    ++step_;
    // This step's samples: --adapt may change the global batch below.
    const int64_t step_samples = source_->samples();
    samples_ += step_samples;
    run_samples_ += step_samples;
    // Summed only where log lines read it: no op per step otherwise.
    if (options_.log_every() > 0) {
      window_loss_ = window_loss_.defined() ? window_loss_ + last_loss_tensor_ : last_loss_tensor_;
    }
    ++window_steps_;
    watch_loss_sum_ =
        watch_loss_sum_.defined() ? watch_loss_sum_ + last_loss_tensor_ : last_loss_tensor_;
    ++watch_steps_;
    // No synchronisation per step: the device keeps its queue. The clock is
    // settled (device work waited for) wherever time is read. --target-loss
    // reads each step's loss, a wait that is training time.
    const std::optional<double> step_loss =
        loss_target_ ? std::optional<double>(last_loss_tensor_.item<double>()) : std::nullopt;
    train_seconds_ += clock_->now_s() - start;
    bool reached = step_loss && reached_target_loss(*step_loss);
    if (step_ % kLossWatchEvery == 0) {
      settle_clock();
      watch_loss();
    }
    // An --adapt window times its steps once the first after a change settled.
    if (adapter_ && adapter_->settles()) {
      settle_clock();
      adapter_->start_timing(train_seconds_, source_->progress());
    }

    // --adapt decides before the epoch's end is read: a larger batch that
    // no longer fits in what is left of the epoch starts the next one.
    if (adapter_ && step_ % adapter_->options().every() == 0 && !finished() && !reached &&
        adapt_batch()) {
      total_steps_ = planned_steps();
    }

    // Evaluation is not training time: the clock is settled before it and
    // the next step's starts after it.
    if (source_->epoch_at(step_) != epoch_) {
      settle_clock();
      if (test_ != nullptr) {
        reached = evaluate_now(TrainEvent::Kind::kEpochEnd) || reached;
      } else {
        emit(TrainEvent::Kind::kEpochEnd);
      }
      epoch_ = source_->epoch_at(step_);
    } else if ((options_.eval_every() > 0 && step_ % options_.eval_every() == 0) ||
               (options_.eval_every_samples() > 0 &&
                samples_ / options_.eval_every_samples() >
                    (samples_ - step_samples) / options_.eval_every_samples())) {
      settle_clock();
      reached = evaluate_now(TrainEvent::Kind::kEvaluation) || reached;
    }
    if (options_.log_every() > 0 && step_ % options_.log_every() == 0) {
      settle_clock();
      emit(TrainEvent::Kind::kLog);
    }
    if (options_.progress_interval_s() > 0 &&
        (train_seconds_ - progress_mark_.train_seconds >= options_.progress_interval_s() ||
         finished())) {
      settle_clock();
      emit(TrainEvent::Kind::kProgress);
    }
    if (!options_.checkpoint_dir().empty() && options_.checkpoint_every() > 0 &&
        step_ % options_.checkpoint_every() == 0 && !finished()) {
      settle_clock();
      save_checkpoint();
    }
    // Data parallel: every rank stops after the same step when any was
    // signalled, so that none is left waiting in a collective.
    const bool stop = data_parallel_.distributed()
                          ? data_parallel_.sum(interrupt_requested() ? 1 : 0) > 0
                          : interrupt_requested();
    if (stop || reached) break;
    if (options_.time_limit_s() > 0 && !finished()) {
      // As with signals, the ranks stop after the same step.
      const bool out_of_time = train_seconds_ >= options_.time_limit_s();
      time_limit_reached = data_parallel_.distributed()
                               ? data_parallel_.sum(out_of_time ? 1 : 0) > 0
                               : out_of_time;
      if (time_limit_reached) break;
    }
  }
  settle_clock();
  watch_loss();
  const bool complete = finished() || reached_.has_value() || time_limit_reached;
  if (last_loss_tensor_.defined()) last_loss_ = last_loss_tensor_.item<double>();
  // An interrupted run skips the final evaluation: the user asked to stop.
  if (complete && test_ != nullptr && test_accuracy_step_ != step_) {
    test_accuracy_ = evaluate();
    test_accuracy_step_ = step_;
    const auto& target = options_.target_accuracy();
    if (target && *test_accuracy_ >= *target) reached_ = Reached{step_, train_seconds_, samples_};
  }
  const TrainSummary s = summary(complete, time_limit_reached);
  // The last checkpoint carries the summary of a finished run (see load_checkpoint).
  if (!options_.checkpoint_dir().empty()) {
    save_checkpoint(complete ? std::optional<TrainSummary>(s) : std::nullopt);
  }
  return s;
}

}  // namespace batchtune
