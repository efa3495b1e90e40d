#include "batchtune/training/trainer.h"

#include "batchtune/training/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "batchtune/common/counts.h"
#include "batchtune/memory/budget_allocator.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/data/input_spec.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/data/loader.h"
#include "batchtune/common/shape.h"
#include "batchtune/common/size.h"
#include "batchtune/step/amp.h"
#include "batchtune/step/workload.h"
#include "out_of_memory.h"
#include "run_options.h"

namespace batchtune {
namespace {

/// The visiting order of epoch `epoch`: a permutation drawn from (seed, epoch)
/// alone, so that a resumed run continues in the same order.
std::vector<int64_t> epoch_order(int64_t size, uint64_t seed, int64_t epoch) {
  BudgetAllocator::UncountedScope uncounted;  // bookkeeping, not device memory
  auto generator = at::make_generator<at::CPUGeneratorImpl>(
      seed * 7919 + static_cast<uint64_t>(epoch) + 1);
  const at::Tensor order = at::randperm(size, generator, at::TensorOptions().dtype(at::kLong));
  const int64_t* data = order.data_ptr<int64_t>();
  return {data, data + size};
}

}  // namespace

Trainer::Trainer(Workload& workload, DeviceMemory& memory, Plan plan, const Dataset& train,
                 const Dataset* test, TrainOptions options)
    : workload_(workload),
      memory_(memory),
      plan_(std::move(plan)),
      start_plan_(plan_),
      train_(train),
      test_(test),
      options_(std::move(options)),
      training_step_(workload, memory.device(),
            StepOptions()
                .micro_batch_size(plan_.micro_batch_size)
                .amp(plan_.amp == AmpMode::kAuto ? AmpMode::kOff : plan_.amp)
                .measure_noise_scale(options_.measure_noise_scale())
                .noise_scale_every(options_.adapt() ? kAdaptNoiseEvery
                                                    : kNoiseScaleEveryWithoutAccumulation)
                .noise_from_successive_steps(options_.adapt())),
      cursor_(std::max<int64_t>(train.size(), 1),
              std::clamp<int64_t>(plan_.global_batch_size, 1, std::max<int64_t>(train.size(), 1))) {
  if (options_.clock() != nullptr) clock_ = options_.clock();
  if (plan_.amp == AmpMode::kAuto) {
    throw OptionError(Option::kAmp, "auto must be resolved before training");
  }
  // As --amp fp16 is refused on the CPU, so is a plan that says fp16 there.
  check_amp_device(plan_.amp, memory.device(), "a plan's \"amp\" (or --amp)");
  check_train_options(options_, test_ != nullptr);
  if (steps_per_epoch() == 0) {
    throw OptionError(Option::kTargetBatch,
                      fmt::format("the global batch {} is larger than the {} training samples; "
                                  "use a smaller batch",
                                  plan_.global_batch_size, train_.size()));
  }
  if (options_.adapt()) {
    AdaptOptions adapt = options_.adapt_options();
    if (adapt.max_global_batch() > train_.size()) {
      throw OptionError(Option::kAdaptMaxBatch,
                        fmt::format("{} is more than the {} training samples; give at most that",
                                    adapt.max_global_batch(), train_.size()));
    }
    if (adapt.max_global_batch() == 0) {
      // The default growth, within the data (a multiple of the world size).
      const int64_t most = train_.size() - train_.size() % plan_.world_size;
      adapt.max_global_batch(std::max(
          plan_.global_batch_size,
          std::min(checked_product(plan_.global_batch_size, kDefaultAdaptGrowth).value_or(most),
                   most)));
    }
    adapter_.emplace(plan_.global_batch_size, plan_.lr, plan_.lr_scaling, plan_.world_size,
                     adapt);
  }
  if (const auto& target = options_.target_loss()) {
    loss_target_.emplace(*target, options_.loss_window());
  }
  const auto& inputs = workload_.input_spec().inputs;
  if (inputs.size() != 1 || train_.sample_shape() != inputs.front().shape) {
    throw OptionError(Option::kInput,
                      fmt::format("the data's samples ({}) do not match the model's input ({})",
                                  format_shape(train_.sample_shape()),
                                  describe(workload_.input_spec())));
  }
}

void Trainer::settle_clock() {
  const double start = clock_->now_s();
  memory_.synchronize();
  train_seconds_ += clock_->now_s() - start;
}

int64_t Trainer::steps_per_epoch() const { return train_.size() / plan_.global_batch_size; }

int64_t Trainer::planned_steps() const {
  if (options_.steps() > 0) return options_.steps();
  return cursor_.first_step_of(options_.epochs());
}

void Trainer::train_step(const Batch& batch) {
  // After an out-of-memory, the same samples in micro-batches half as large:
  // the logical batch stays.
  const auto halve_micro_batch = [&](const std::string& why) {
    if (plan_.micro_batch_size == 1) {
      throw Error(fmt::format(
          "train: out of memory at micro-batch 1 (optimizer step {}): {}; the model does not "
          "fit in {} — use a larger --memory-limit or a smaller model",
          step_ + 1, why, format_bytes(memory_.usable_bytes())));
    }
    const int64_t before = plan_.micro_batch_size;
    plan_.micro_batch_size = (plan_.micro_batch_size + 1) / 2;
    plan_.accumulation_steps = ceil_div(batch.size(), plan_.micro_batch_size);
    training_step_.set_micro_batch_size(plan_.micro_batch_size);
    if (adapter_) adapter_->cap_micro_batch(plan_.micro_batch_size);
    ++oom_recoveries_;
    emit(TrainEvent::Kind::kOomRecovery,
         fmt::format("out of memory at micro-batch {} (step {}); retrying the same {} samples "
                     "as {} micro-batches of {}",
                     before, step_ + 1, plan_.global_batch_size, plan_.accumulation_steps,
                     plan_.micro_batch_size));
  };
  // Data parallel: `batch` is this rank's shard of the logical batch (see
  // run()); the ranks agree on an out-of-memory, so that all shrink together.
  last_loss_tensor_ = backward_until_it_fits(
      memory_, training_step_, data_parallel_,
      [&] { return training_step_.backward(batch, step_, &data_seconds_); }, halve_micro_batch);
  // Data parallel: this rank's gradient against the all-reduced one is a
  // measurement of the noise scale at (local, global batch), for the price
  // of two norms on the device (McCandlish et al.'s own use of the ranks).
  const bool measure_ranks =
      options_.measure_noise_scale() && data_parallel_.world_size() > 1 && batch.size() > 0;
  at::Tensor local_sq;
  if (measure_ranks) local_sq = squared_gradient_norm(workload_.model().parameters());
  data_parallel_.average_gradients(workload_.model().parameters(), &memory_);
  if (measure_ranks) {
    LossScaler& scaler = training_step_.scaler();
    training_step_.noise_scale().add(
        batch.size(), std::move(local_sq), batch.size() * data_parallel_.world_size(),
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
    BatchChange start;
    start.step = step_;
    start.global_batch_size = plan_.global_batch_size;
    start.micro_batch_size = plan_.micro_batch_size;
    start.accumulation_steps = plan_.accumulation_steps;
    start.lr = plan_.lr;
    start.reason = "the plan's global batch and lr, where adapting starts";
    schedule_.push_back(start);
  }
  std::vector<int64_t> order;
  int64_t order_epoch = -1;
  memory_.reset_peak();

  // The loader asks for step s's samples ahead of time (and from its own
  // threads with --workers); they follow from (seed, epoch) and the batch
  // changes alone. A change makes a new loader from the step it takes
  // effect at: the batches built ahead at the old size are dropped unused.
  const auto make_loader = [&](std::optional<Loader>& loader) {
    loader.reset();
    loader.emplace(
        train_,
        [&](int64_t step) -> std::optional<std::vector<int64_t>> {
          if (step >= total_steps_) return std::nullopt;
          const SamplePosition at = cursor_.at(step);
          if (order_epoch != at.epoch) {
            order = epoch_order(train_.size(), options_.seed(), at.epoch);
            order_epoch = at.epoch;
          }
          const auto first = order.begin() + at.offset;
          // Data parallel: this rank's shard of the logical batch.
          return data_parallel_.shard(
              std::vector<int64_t>(first, first + cursor_.global_batch(step)));
        },
        LoaderOptions()
            .workers(plan_.workers)
            .prefetch(plan_.prefetch)
            .pin_memory(plan_.pin_memory && memory_.device().is_cuda())
            .first_batch(step_)
            .seed(options_.seed())
            .clock(clock_));
  };
  std::optional<Loader> loader;
  make_loader(loader);
  training_step_.set_clock(*clock_);

  bool time_limit_reached = false;
  while (step_ < total_steps_) {
    const double start = clock_->now_s();
    if (before_step_) before_step_(step_);
    const double waited = loader->wait_seconds();
    const std::optional<Batch> batch = loader->next();
    data_seconds_ += loader->wait_seconds() - waited;
    TORCH_CHECK(batch, "Trainer: the loader ended before step ", step_ + 1);
    train_step(*batch);
    ++step_;
    ++batch_in_epoch_;
    // This step's samples: --adapt may change the global batch below.
    const int64_t step_samples = plan_.global_batch_size;
    samples_ += step_samples;
    run_samples_ += step_samples;
    // Summed only where log lines read it: no op per step otherwise.
    if (options_.log_every() > 0) {
      window_loss_ = window_loss_.defined() ? window_loss_ + last_loss_tensor_ : last_loss_tensor_;
    }
    ++window_steps_;
    // No synchronisation per step: the device keeps its queue. The clock is
    // settled (device work waited for) wherever time is read. --target-loss
    // reads each step's loss, a wait that is training time.
    const std::optional<double> step_loss =
        loss_target_ ? std::optional<double>(last_loss_tensor_.item<double>()) : std::nullopt;
    train_seconds_ += clock_->now_s() - start;
    bool reached = step_loss && reached_target_loss(*step_loss);
    // An --adapt window times its steps once the first after a change settled.
    if (adapter_ && adapter_->settles()) {
      settle_clock();
      adapter_->start_timing(train_seconds_, run_samples_);
    }

    // --adapt decides before the epoch's end is read: a larger batch that
    // no longer fits in what is left of the epoch starts the next one.
    if (adapter_ && step_ % adapter_->options().every() == 0 && step_ < total_steps_ &&
        !reached && adapt_batch()) {
      total_steps_ = planned_steps();
      make_loader(loader);
    }

    // Evaluation is not training time: the clock is settled before it and
    // the next step's starts after it.
    if (cursor_.at(step_).epoch != epoch_) {
      settle_clock();
      if (test_ != nullptr) {
        reached = evaluate_now(TrainEvent::Kind::kEpochEnd) || reached;
      } else {
        emit(TrainEvent::Kind::kEpochEnd);
      }
      epoch_ = cursor_.at(step_).epoch;
      batch_in_epoch_ = 0;
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
         step_ == total_steps_)) {
      settle_clock();
      emit(TrainEvent::Kind::kProgress);
    }
    if (!options_.checkpoint_dir().empty() && options_.checkpoint_every() > 0 &&
        step_ % options_.checkpoint_every() == 0 && step_ < total_steps_) {
      settle_clock();
      save_checkpoint();
    }
    // Data parallel: every rank stops after the same step when any was
    // signalled, so that none is left waiting in a collective.
    const bool stop = data_parallel_.distributed()
                          ? data_parallel_.sum(interrupt_requested() ? 1 : 0) > 0
                          : interrupt_requested();
    if (stop || reached) break;
    if (options_.time_limit_s() > 0 && step_ < total_steps_) {
      // As with signals, the ranks stop after the same step.
      const bool out_of_time = train_seconds_ >= options_.time_limit_s();
      time_limit_reached = data_parallel_.distributed()
                               ? data_parallel_.sum(out_of_time ? 1 : 0) > 0
                               : out_of_time;
      if (time_limit_reached) break;
    }
  }
  settle_clock();
  const bool complete = step_ >= total_steps_ || reached_.has_value() || time_limit_reached;
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
