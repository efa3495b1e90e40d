#include "sample_steps.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>

#include "batchtune/common/counts.h"
#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/common/shape.h"
#include "batchtune/common/size.h"
#include "batchtune/data/input_spec.h"
#include "batchtune/memory/budget_allocator.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/training_step.h"
#include "batchtune/step/workload.h"
#include "batchtune/training/checkpoint.h"

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

SampleSteps::SampleSteps(const Dataset& train, const Workload& workload, Plan& plan,
                         const TrainOptions& options, DataParallel& data_parallel,
                         DeviceMemory& memory)
    : train_(train),
      plan_(plan),
      start_plan_(plan),
      options_(options),
      data_parallel_(data_parallel),
      memory_(memory),
      cursor_(std::max<int64_t>(train.size(), 1),
              std::clamp<int64_t>(plan.global_batch_size, 1, std::max<int64_t>(train.size(), 1))) {
  if (steps_per_epoch() == 0) {
    throw OptionError(Option::kTargetBatch,
                      fmt::format("the global batch {} is larger than the {} training samples; "
                                  "use a smaller batch",
                                  plan_.global_batch_size, train_.size()));
  }
  const auto& inputs = workload.input_spec().inputs;
  if (inputs.size() != 1 || train_.sample_shape() != inputs.front().shape) {
    throw OptionError(Option::kInput,
                      fmt::format("the data's samples ({}) do not match the model's input ({})",
                                  format_shape(train_.sample_shape()),
                                  batchtune::describe(workload.input_spec())));
  }
  if (options_.adapt()) adapt_options();  // its limit checked before the first step
}

AdaptOptions SampleSteps::adapt_options() const {
  AdaptOptions adapt = options_.adapt_options();
  if (adapt.max_global_batch() > train_.size()) {
    throw OptionError(Option::kAdaptMaxBatch,
                      fmt::format("{} is more than the {} training samples; give at most that",
                                  adapt.max_global_batch(), train_.size()));
  }
  if (adapt.max_global_batch() == 0) {
    // The default growth, within the data (a multiple of the world size).
    const int64_t most = train_.size() - train_.size() % start_plan_.world_size;
    adapt.max_global_batch(std::max(
        start_plan_.global_batch_size,
        std::min(checked_product(start_plan_.global_batch_size, kDefaultAdaptGrowth).value_or(most),
                 most)));
  }
  return adapt;
}

double SampleSteps::epochs_at(int64_t step) const {
  if (!options_.adapt()) {
    return static_cast<double>(step) / static_cast<double>(steps_per_epoch());
  }
  const SamplePosition at = cursor_.at(step);
  return static_cast<double>(at.epoch) +
         static_cast<double>(at.offset) / static_cast<double>(train_.size());
}

std::string SampleSteps::position_in_epoch(int64_t step) const {
  return fmt::format("batch {} of it", step - cursor_.first_step_of(cursor_.at(step).epoch));
}

void SampleSteps::start(int64_t step, const Clock& clock) {
  clock_ = &clock;
  // The loader asks for step s's samples ahead of time (and from its own
  // threads with --workers); they follow from (seed, epoch) and the batch
  // changes alone. A change makes a new loader from the step it takes
  // effect at: the batches built ahead at the old size are dropped unused.
  const int64_t last =
      options_.steps() > 0 ? options_.steps() : cursor_.first_step_of(options_.epochs());
  loader_.reset();
  loader_.emplace(
      train_,
      [this, last](int64_t s) -> std::optional<std::vector<int64_t>> {
        if (s >= last) return std::nullopt;
        const SamplePosition at = cursor_.at(s);
        if (order_epoch_ != at.epoch) {
          order_ = epoch_order(train_.size(), options_.seed(), at.epoch);
          order_epoch_ = at.epoch;
        }
        const auto first = order_.begin() + at.offset;
        // Data parallel: this rank's shard of the logical batch.
        return data_parallel_.shard(std::vector<int64_t>(first, first + cursor_.global_batch(s)));
      },
      LoaderOptions()
          .workers(plan_.workers)
          .prefetch(plan_.prefetch)
          .pin_memory(plan_.pin_memory && memory_.device().is_cuda())
          .first_batch(step)
          .seed(options_.seed())
          .clock(clock_));
}

void SampleSteps::next(int64_t step, bool /*split_for_noise*/, double& data_seconds) {
  const double waited = loader_->wait_seconds();
  batch_ = loader_->next();
  data_seconds += loader_->wait_seconds() - waited;
  TORCH_CHECK(batch_, "Trainer: the loader ended before step ", step + 1);
  run_samples_ += plan_.global_batch_size;
}

at::Tensor SampleSteps::backward(TrainingStep& step, int64_t step_index, double& data_seconds) {
  return step.backward(*batch_, step_index, &data_seconds);
}

std::string SampleSteps::shrink(const std::string& why, int64_t step_index, TrainingStep& step) {
  // The same samples in micro-batches half as large: the logical batch stays.
  if (plan_.micro_batch_size == 1) {
    throw Error(fmt::format(
        "train: out of memory at micro-batch 1 (optimizer step {}): {}; the model does not "
        "fit in {} — use a larger --memory-limit or a smaller model",
        step_index + 1, why, format_bytes(memory_.usable_bytes())));
  }
  const int64_t before = plan_.micro_batch_size;
  plan_.micro_batch_size = (plan_.micro_batch_size + 1) / 2;
  plan_.accumulation_steps = ceil_div(batch_->size(), plan_.micro_batch_size);
  step.set_micro_batch_size(plan_.micro_batch_size);
  cap_ = plan_.micro_batch_size;
  return fmt::format(
      "out of memory at micro-batch {} (step {}); retrying the same {} samples as {} "
      "micro-batches of {}",
      before, step_index + 1, plan_.global_batch_size, plan_.accumulation_steps,
      plan_.micro_batch_size);
}

BatchChange SampleSteps::start_change() const {
  BatchChange start;
  start.global_batch_size = plan_.global_batch_size;
  start.micro_batch_size = plan_.micro_batch_size;
  start.accumulation_steps = plan_.accumulation_steps;
  start.reason = "the plan's global batch and lr, where adapting starts";
  return start;
}

std::string SampleSteps::resize(BatchChange& change, TrainingStep& step) {
  const int64_t before = plan_.global_batch_size;
  plan_.global_batch_size = change.global_batch_size;
  plan_.micro_batch_size = change.micro_batch_size;
  plan_.accumulation_steps = change.accumulation_steps;
  step.set_micro_batch_size(change.micro_batch_size);
  cursor_.change(change.step, change.global_batch_size);
  start(change.step, *clock_);
  return fmt::format("adapt: global batch {} -> {} ({} x {} per rank)", before,
                     change.global_batch_size, change.micro_batch_size,
                     change.accumulation_steps);
}

void SampleSteps::identify(RunIdentity& id) const {
  id.world_size = start_plan_.world_size;
  id.global_batch_size = start_plan_.global_batch_size;
  id.train_size = train_.size();
}

void SampleSteps::save(CheckpointRecord& record) const {
  const int64_t step = record.position.step;
  record.position.batch_in_epoch = step - cursor_.first_step_of(cursor_.at(step).epoch);
}

void SampleSteps::load(const CheckpointRecord& record, const std::vector<BatchChange>& schedule,
                       const std::string& /*path*/) {
  for (size_t i = 1; i < schedule.size(); ++i) {
    cursor_.change(schedule[i].step, schedule[i].global_batch_size);
  }
  if (record.adapt) {
    // The plan as it stood: the schedule's batch and lr, any smaller
    // micro-batch an out-of-memory forced.
    plan_.global_batch_size = record.plan.global_batch_size;
    plan_.micro_batch_size = record.plan.micro_batch_size;
    plan_.accumulation_steps = record.plan.accumulation_steps;
    plan_.lr = record.plan.lr;
  } else if (record.plan.micro_batch_size < plan_.micro_batch_size) {
    // Keep the smaller micro-batch an earlier out-of-memory forced.
    plan_.micro_batch_size = record.plan.micro_batch_size;
    plan_.accumulation_steps = ceil_div(plan_.global_batch_size, plan_.micro_batch_size);
  }
}

void SampleSteps::describe(TrainEvent& /*event*/, double /*train_seconds*/) const {}

void SampleSteps::summarize(TrainSummary& summary, double /*seconds*/) const {
  summary.epochs = epochs_at(summary.steps);
}

}  // namespace batchtune
