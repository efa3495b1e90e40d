#include "batchtune/training/token_trainer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "batchtune/common/counts.h"
#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/common/option.h"
#include "batchtune/common/size.h"
#include "batchtune/data/token_batches.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/amp.h"
#include "batchtune/step/workload.h"
#include "out_of_memory.h"
#include "run_options.h"
#include "token_run.h"

namespace batchtune {

TokenRun::TokenRun(Workload& workload, DeviceMemory& memory, const Plan& plan,
                   const TextDataset& data, const TokenTrainOptions& options,
                   const TrainCallback& callback, const std::function<void(int64_t)>& before_step)
    : workload_(workload),
      memory_(memory),
      plan_(plan),
      options_(options),
      run_(options.run()),
      callback_(callback),
      before_step_(before_step),
      clock_(options.run().clock() != nullptr ? *options.run().clock() : steady_clock()),
      fixed_(options.fixed_batch_size() > 0),
      lengths_(data.lengths()),
      step_(workload, memory.device(),
            StepOptions()
                .amp(plan.amp)
                .measure_noise_scale(options.run().measure_noise_scale())
                .noise_scale_every(options.run().adapt() ? kAdaptNoiseEvery
                                                         : kNoiseScaleEveryWithoutAccumulation)
                .noise_from_successive_steps(options.run().adapt())),
      lr_(plan.lr) {
  if (!fixed_ && plan.token_budget < 1) {
    throw OptionError(Option::kPlan, "training by tokens needs a plan with a token_budget (tune "
                                     "with " + mention(Option::kInput) + " int64:MIN..MAX)");
  }
  // Text has no test split: what only evaluation reads is refused here.
  check_train_options(run_, /*has_test=*/false);
  if (run_.eval_every() > 0 || run_.eval_every_samples() > 0) {
    throw OptionError(run_.eval_every() > 0 ? Option::kEvalEvery : Option::kEvalEverySamples,
                      "text has no test split to evaluate; stop at a training loss with " +
                          mention(Option::kTargetLoss));
  }
  if (options.target_tokens() < 0) {
    throw OptionError(Option::kTargetTokens,
                      fmt::format("must be at least 1, got {}", options.target_tokens()));
  }
  check_amp_device(plan.amp, memory.device(), "a plan's \"amp\" (or --amp)");
  source_.emplace(data, plan, options);
  const int64_t target_tokens = source_->target_tokens();
  if (run_.adapt()) {
    if (fixed_) {
      throw OptionError(Option::kAdapt, "moves the tokens per step of a token budget; leave out " +
                                            mention(Option::kBatchSize));
    }
    AdaptOptions adapt = run_.adapt_options();
    adapt.unit("tokens");
    int64_t data_tokens = 0;
    for (int64_t l : lengths_) data_tokens += l;
    if (adapt.max_global_batch() > data_tokens) {
      throw OptionError(Option::kAdaptMaxBatch,
                        fmt::format("{} tokens is more than the data's {}; give at most that",
                                    adapt.max_global_batch(), data_tokens));
    }
    if (adapt.max_global_batch() == 0) {
      adapt.max_global_batch(std::max(
          target_tokens,
          std::min(checked_product(target_tokens, kDefaultAdaptGrowth).value_or(data_tokens),
                   data_tokens)));
    }
    adapter_.emplace(target_tokens, plan.lr, plan.lr_scaling, 1, adapt);
    // Past the plan's budget a step grows by accumulation alone.
    adapter_->cap_micro_batch(source_->cap());
    BatchChange start;
    start.global_batch_size = target_tokens;
    start.micro_batch_size = source_->budget();
    start.accumulation_steps = ceil_div(target_tokens, source_->budget());
    start.lr = plan.lr;
    start.reason = "the real tokens per step and lr the run starts from, where adapting starts";
    summary_.batch_schedule.push_back(start);
  }
  summary_.world_size = 1;
  if (const auto& target = run_.target_loss()) {
    loss_target_.emplace(*target, run_.loss_window());
    summary_.target = TrainTarget{"train_loss", *target};
  }
}

std::vector<TokenBatch> TokenRun::next_group() {
  // A step of one micro-batch measures the noise scale now and then split
  // in two halves (the same samples and tokens), unless it measures against
  // the previous step.
  const int64_t every = step_.options().noise_scale_every();
  return source_->next_group(run_.measure_noise_scale() &&
                             !step_.options().noise_from_successive_steps() &&
                             summary_.steps % every == 0);
}

at::Tensor TokenRun::train_group(std::vector<TokenBatch>& group, int64_t group_tokens) {
  return backward_until_it_fits(
      memory_, step_, data_parallel_,
      [&] {
        const std::vector<Batch> batches = source_->batches(group);
        std::vector<double> weights;
        std::vector<int64_t> noise_sizes;
        for (const auto& b : group) {
          weights.push_back(static_cast<double>(b.tokens) / static_cast<double>(group_tokens));
          noise_sizes.push_back(b.tokens);
        }
        if (!run_.measure_noise_scale() ||
            (group.size() < 2 && !step_.options().noise_from_successive_steps())) {
          noise_sizes.clear();
        }
        return step_.backward_weighted(batches, weights, noise_sizes);
      },
      [&](const std::string& why) { shrink_budget(why, group_tokens); });
}

void TokenRun::shrink_budget(const std::string& why, int64_t group_tokens) {
  const int64_t before = source_->budget();
  if (!source_->halve_budget()) {
    throw Error(fmt::format(
        "train: out of memory at {} (step {}): {}; not even one sample of {} tokens fits in {}",
        fixed_ ? fmt::format("fixed batches of {}", options_.fixed_batch_size())
               : fmt::format("a token budget of {}", before),
        summary_.steps + 1, why, source_->longest(), format_bytes(memory_.usable_bytes())));
  }
  if (adapter_) adapter_->cap_micro_batch(source_->cap());
  ++summary_.oom_recoveries;
  TrainEvent event;
  event.kind = TrainEvent::Kind::kOomRecovery;
  event.step = summary_.steps;
  event.epoch = epoch_;
  event.message = fmt::format(
      "out of memory at a token budget of {} (step {}); retrying the same {} tokens with a "
      "budget of {}",
      before, summary_.steps + 1, group_tokens, source_->budget());
  emit(event);
}

void TokenRun::adapt() {
  memory_.synchronize();
  const int64_t before = source_->target_tokens();
  adapter_->end_window(before, clock_.now_s() - start_s_, summary_.tokens);
  const NoiseScaleEstimator& noise = step_.noise_scale().estimator();
  const std::optional<double> noise_scale = noise.noise_scale();
  std::optional<BatchChange> change = adapter_->decide(summary_.steps, before, noise);
  if (!change) return;
  ramp_.restart(summary_.steps, ramp_.at(summary_.steps, lr_));
  lr_ = change->lr;
  source_->set_target_tokens(change->global_batch_size);
  change->micro_batch_size = source_->budget();
  change->accumulation_steps = ceil_div(source_->target_tokens(), source_->budget());
  summary_.batch_schedule.push_back(*change);
  TrainEvent event;
  event.kind = TrainEvent::Kind::kBatchChange;
  event.step = summary_.steps;
  event.epoch = epoch_;
  event.lr = change->lr;
  event.noise_scale = noise_scale;
  event.message = fmt::format(
      "adapt: {} -> {} real tokens per step (micro-batches of {} padded tokens), lr {:.3g} "
      "over {} steps: {}",
      before, source_->target_tokens(), source_->budget(), change->lr, kAdaptLrRampSteps,
      change->reason);
  emit(event);
}

TrainSummary TokenRun::run() {
  start_s_ = clock_.now_s();
  if (run_.resume()) {
    if (std::optional<TrainSummary> finished = resume()) return *finished;
    if (adapter_) adapter_->restart_window(0, summary_.tokens);
  }
  start_samples_ = summary_.samples;
  start_tokens_ = summary_.tokens;
  const int64_t epochs =
      run_.steps() > 0 ? std::numeric_limits<int64_t>::max() : run_.epochs();
  const auto steps_done = [&] { return run_.steps() > 0 && summary_.steps >= run_.steps(); };
  const bool checkpoints = !run_.checkpoint_dir().empty();
  std::string interrupted_by;
  for (; epoch_ < epochs; ++epoch_) {
    // The epoch a resume stopped in continues with the micro-batches it had
    // left, and the samples it had counted.
    if (!resumed_) epoch_samples_ = 0;
    resumed_ = false;
    source_->start_epoch(epoch_);
    while (!source_->epoch_done() && !steps_done()) {
      // One optimizer step: micro-batches until they hold the target tokens.
      std::vector<TokenBatch> group = next_group();
      int64_t group_tokens = 0;
      for (const auto& b : group) group_tokens += b.tokens;
      if (before_step_) before_step_(summary_.steps);
      const at::Tensor loss = train_group(group, group_tokens);
      const double lr = scheduled_lr(adapter_ ? ramp_.at(summary_.steps, lr_) : plan_.lr,
                                     plan_.warmup_steps, summary_.steps);
      apply_or_explain(memory_, step_, lr, summary_.steps);
      summary_.final_loss = loss.item<double>();
      ++summary_.steps;
      summary_.micro_batches += static_cast<int64_t>(group.size());
      for (const auto& b : group) {
        const auto samples = static_cast<int64_t>(b.indices.size());
        summary_.samples += samples;
        epoch_samples_ += samples;
        summary_.tokens += b.tokens;
        summary_.padded_tokens += source_->padded_tokens(b);
      }
      loss_since_log_ += summary_.final_loss;
      ++steps_since_log_;
      if (run_.log_every() > 0 && summary_.steps % run_.log_every() == 0) {
        log(loss_since_log_ / static_cast<double>(steps_since_log_), lr, group);
        loss_since_log_ = 0;
        steps_since_log_ = 0;
      }
      if (loss_target_ && reached_target(summary_.final_loss)) break;
      // An --adapt window times its steps once the first after a change settled.
      if (adapter_ && adapter_->settles()) {
        memory_.synchronize();
        adapter_->start_timing(clock_.now_s() - start_s_, summary_.tokens);
      }
      if (adapter_ && summary_.steps % adapter_->options().every() == 0) adapt();
      if (interrupt_requested()) {
        interrupted_by = interrupt_name();
        break;
      }
      if (checkpoints && run_.checkpoint_every() > 0 &&
          summary_.steps % run_.checkpoint_every() == 0 && !steps_done()) {
        save_checkpoint();
      }
      // The loss read above waited for the step: the clock is settled. The
      // limit stops a run with steps left, not one that just ended.
      const bool run_ended = steps_done() || (source_->epoch_done() && epoch_ + 1 >= epochs);
      if (run_.time_limit_s() > 0 && clock_.now_s() - start_s_ >= run_.time_limit_s() &&
          !run_ended) {
        summary_.time_limit_reached = true;
        break;
      }
    }
    // Whole epochs, and the share of the last one that ran.
    summary_.epochs = static_cast<double>(epoch_) +
                      (lengths_.empty() ? 1.0
                                        : static_cast<double>(epoch_samples_) /
                                              static_cast<double>(lengths_.size()));
    if (steps_done() || !interrupted_by.empty() || summary_.target_reached ||
        summary_.time_limit_reached) {
      break;
    }
  }
  TrainSummary s = finish(interrupted_by);
  if (checkpoints) {
    // The last checkpoint: a finished run's holds its summary.
    save_checkpoint(s.complete ? std::optional<TrainSummary>(s) : std::nullopt);
  }
  return s;
}

TrainSummary TokenRun::finish(const std::string& interrupted_by) {
  memory_.synchronize();
  TrainSummary& s = summary_;
  s.complete = interrupted_by.empty();
  s.interrupted_by = interrupted_by;
  s.seconds = clock_.now_s() - start_s_;
  // Rates of this run, a resume's earlier steps left out.
  s.samples_per_s =
      s.seconds > 0 ? static_cast<double>(s.samples - start_samples_) / s.seconds : 0;
  s.tokens_per_s = s.seconds > 0 ? static_cast<double>(s.tokens - start_tokens_) / s.seconds : 0;
  s.token_budget = fixed_ ? 0 : source_->budget();
  s.target_tokens = source_->target_tokens();  // 0: fixed batches, a set count a step
  s.micro_batch_size = fixed_ ? options_.fixed_batch_size() : plan_.micro_batch_size;
  s.accumulation_steps = source_->group_size() > 0 ? source_->group_size() : 1;
  s.global_batch_size = s.steps > 0 ? s.samples / s.steps : 0;
  s.noise_scale = step_.noise_scale().noise_scale();
  return s;
}

TrainSummary train_by_tokens(Workload& workload, DeviceMemory& memory, const Plan& plan,
                             const TextDataset& data, const TokenTrainOptions& options,
                             const TrainCallback& callback,
                             const std::function<void(int64_t)>& before_step) {
  return TokenRun(workload, memory, plan, data, options, callback, before_step).run();
}

}  // namespace batchtune
