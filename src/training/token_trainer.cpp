#include "batchtune/training/token_trainer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <optional>

#include "batchtune/common/error.h"
#include "batchtune/common/size.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/amp.h"
#include "batchtune/step/trial_failure.h"
#include "batchtune/step/workload.h"

namespace batchtune {
namespace {

/// `batch`'s samples in two halves (the same samples and tokens), each
/// padded to its own longest.
std::pair<TokenBatch, TokenBatch> split(const TokenBatch& batch,
                                        const std::vector<int64_t>& lengths) {
  std::vector<int64_t> sorted = batch.indices;
  // The shorter samples together, so that the halves pad less.
  std::sort(sorted.begin(), sorted.end(), [&](int64_t a, int64_t b) {
    return lengths[static_cast<size_t>(a)] < lengths[static_cast<size_t>(b)];
  });
  const auto half = static_cast<std::ptrdiff_t>(sorted.size() / 2);
  std::pair<TokenBatch, TokenBatch> out;
  out.first.indices.assign(sorted.begin(), sorted.begin() + half);
  out.second.indices.assign(sorted.begin() + half, sorted.end());
  for (TokenBatch* b : {&out.first, &out.second}) {
    int64_t longest = 0;
    for (int64_t i : b->indices) {
      b->tokens += lengths[static_cast<size_t>(i)];
      longest = std::max(longest, lengths[static_cast<size_t>(i)]);
    }
    b->padded_tokens = static_cast<int64_t>(b->indices.size()) * longest;
  }
  return out;
}

/// Micro-batches within `budget`: those above it split until they fit (a
/// single sample always does: the budget is at least the longest sample).
std::vector<TokenBatch> within(const std::vector<TokenBatch>& batches, int64_t budget,
                               const std::vector<int64_t>& lengths) {
  std::vector<TokenBatch> out;
  std::vector<TokenBatch> todo(batches.rbegin(), batches.rend());
  while (!todo.empty()) {
    TokenBatch b = std::move(todo.back());
    todo.pop_back();
    if (b.padded_tokens <= budget || b.indices.size() < 2) {
      out.push_back(std::move(b));
      continue;
    }
    auto [first, second] = split(b, lengths);
    todo.push_back(std::move(second));
    todo.push_back(std::move(first));
  }
  return out;
}

}  // namespace

TrainSummary train_by_tokens(Workload& workload, DeviceMemory& memory, const Plan& plan,
                             const TextDataset& data, const TokenTrainOptions& options,
                             const TrainCallback& callback,
                             const std::function<void(int64_t)>& before_step) {
  const bool fixed = options.fixed_batch_size() > 0;
  if (!fixed && plan.token_budget < 1) {
    throw Error("--plan: training by tokens needs a plan with a token_budget (tune with --input "
                "int64:MIN..MAX)");
  }
  if (options.epochs() < 1 && options.steps() < 1) {
    throw Error("--epochs/--steps: give at least 1 epoch or step");
  }
  const std::vector<int64_t>& lengths = data.lengths();
  const int64_t pad_to = fixed ? std::max(options.pad_to(), data.length_range().max) : 0;
  std::optional<LengthBucketSampler> sampler;
  if (!fixed) sampler.emplace(lengths, plan.length_buckets, plan.token_budget, options.seed());
  int64_t budget = fixed ? options.fixed_batch_size() * pad_to : plan.token_budget;
  if (options.target_tokens() < 0) {
    throw Error(fmt::format("--target-tokens: must be at least 1, got {}", options.target_tokens()));
  }
  // Fixed batches without a token target: the plan's micro-batches per step
  // (one for --batch-size), never more on account of their padding.
  const int64_t group_size =
      fixed && options.target_tokens() == 0 ? std::max<int64_t>(1, plan.accumulation_steps) : 0;
  const int64_t target_tokens =
      options.target_tokens() > 0 ? options.target_tokens() : group_size > 0 ? 0 : budget;
  if (const auto& target = options.target_loss()) {
    if (!(std::isfinite(*target) && *target > 0)) {
      throw Error(fmt::format("--target-loss: must be a positive loss, like 1.5; got {}", *target));
    }
  }
  if (options.loss_window() < 1) {
    throw Error(fmt::format("--target-loss: the loss window must be at least 1 step, got {}",
                            options.loss_window()));
  }
  const Clock& clock = options.clock() != nullptr ? *options.clock() : steady_clock();

  check_amp_device(plan.amp, memory.device(), "a plan's \"amp\" (or --amp)");
  TrainingStep step(workload, memory.device(), StepOptions().amp(plan.amp));
  TrainSummary summary;
  summary.world_size = 1;
  if (options.target_loss()) summary.target = TrainTarget{"train_loss", *options.target_loss()};
  const double start = clock.now_s();
  double loss_since_log = 0;
  int64_t steps_since_log = 0;
  std::deque<double> window;  // the last `loss_window` steps' losses
  double window_sum = 0;
  const int64_t epochs = options.steps() > 0 ? std::numeric_limits<int64_t>::max() : options.epochs();
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    std::vector<TokenBatch> micro =
        fixed ? fixed_batches(lengths, options.fixed_batch_size(), pad_to, options.seed(), epoch)
              : sampler->epoch(epoch);
    size_t next = 0;
    while (next < micro.size()) {
      if (options.steps() > 0 && summary.steps >= options.steps()) break;
      // One optimizer step: micro-batches until they hold the target tokens.
      std::vector<TokenBatch> group;
      int64_t group_tokens = 0;
      while (next < micro.size() &&
             (group_size > 0 ? static_cast<int64_t>(group.size()) < group_size
                             : group_tokens < target_tokens)) {
        group_tokens += micro[next].tokens;
        group.push_back(micro[next++]);
      }
      if (before_step) before_step(summary.steps);
      at::Tensor loss;
      for (;;) {
        if (!fixed) group = within(group, budget, lengths);
        std::vector<Batch> batches;
        std::vector<double> weights;
        for (const auto& b : group) {
          batches.push_back(data.get_batch(b.indices));
          if (fixed) {
            // Padded to the longest sequence, as a fixed batch is.
            Batch& last = batches.back();
            const int64_t have = last.inputs[0].size(1);
            if (have < pad_to) {
              last.inputs[0] = at::constant_pad_nd(last.inputs[0], {0, pad_to - have}, 0);
              last.target = at::constant_pad_nd(last.target, {0, pad_to - have}, kIgnoreTarget);
            }
          }
          weights.push_back(static_cast<double>(b.tokens) / static_cast<double>(group_tokens));
        }
        const int64_t ooms_before = memory.oom_count();
        try {
          loss = step.backward_weighted(batches, weights);
          break;
        } catch (const c10::Error& e) {
          if (classify_step_failure(e, ooms_before, memory.oom_count()) !=
              StepFailure::kOutOfMemory) {
            throw;
          }
          memory.release_cached();
          const int64_t longest = data.length_range().max;
          if (fixed || budget <= longest) {
            throw Error(fmt::format(
                "train: out of memory at {} (step {}): {}; not even one sample of {} tokens fits "
                "in {}",
                fixed ? fmt::format("fixed batches of {}", options.fixed_batch_size())
                      : fmt::format("a token budget of {}", budget),
                summary.steps + 1, first_line(e.what_without_backtrace()), longest,
                format_bytes(memory.usable_bytes())));
          }
          const int64_t before = budget;
          budget = std::max(longest, budget / 2);
          sampler->set_token_budget(budget);
          ++summary.oom_recoveries;
          if (callback) {
            TrainEvent event;
            event.kind = TrainEvent::Kind::kOomRecovery;
            event.step = summary.steps;
            event.epoch = epoch;
            event.message = fmt::format(
                "out of memory at a token budget of {} (step {}); retrying the same {} tokens "
                "with a budget of {}",
                before, summary.steps + 1, group_tokens, budget);
            callback(event);
          }
        }
      }
      const double lr = scheduled_lr(plan.lr, plan.warmup_steps, summary.steps);
      step.apply(lr);
      summary.final_loss = loss.item<double>();
      ++summary.steps;
      summary.micro_batches += static_cast<int64_t>(group.size());
      for (const auto& b : group) {
        summary.samples += static_cast<int64_t>(b.indices.size());
        summary.tokens += b.tokens;
        summary.padded_tokens += fixed ? static_cast<int64_t>(b.indices.size()) * pad_to
                                       : b.padded_tokens;
      }
      loss_since_log += summary.final_loss;
      ++steps_since_log;
      if (callback && options.log_every() > 0 && summary.steps % options.log_every() == 0) {
        TrainEvent event;
        event.kind = TrainEvent::Kind::kLog;
        event.step = summary.steps;
        event.total_steps = options.steps();
        event.epoch = epoch;
        event.loss = loss_since_log / static_cast<double>(steps_since_log);
        event.lr = lr;
        const double seconds = clock.now_s() - start;
        event.samples_per_s = seconds > 0 ? static_cast<double>(summary.samples) / seconds : 0;
        event.memory_used_bytes = memory.live_bytes();
        event.memory_peak_bytes = memory.peak_bytes();
        event.memory_capacity_bytes = memory.capacity_bytes();
        event.message = fmt::format("{:.0f} tokens/s, token budget {}",
                                    seconds > 0 ? static_cast<double>(summary.tokens) / seconds : 0,
                                    budget);
        callback(event);
        loss_since_log = 0;
        steps_since_log = 0;
      }
      if (const auto& target = options.target_loss()) {
        window.push_back(summary.final_loss);
        window_sum += summary.final_loss;
        if (static_cast<int64_t>(window.size()) > options.loss_window()) {
          window_sum -= window.front();
          window.pop_front();
        }
        const double mean = window_sum / static_cast<double>(window.size());
        if (static_cast<int64_t>(window.size()) == options.loss_window() && mean <= *target) {
          summary.target_reached = true;
          summary.steps_to_target = summary.steps;
          summary.seconds_to_target = clock.now_s() - start;
          summary.samples_to_target = summary.samples;
          if (callback) {
            TrainEvent event;
            event.kind = TrainEvent::Kind::kTargetReached;
            event.step = summary.steps;
            event.epoch = epoch;
            event.loss = mean;
            event.message = fmt::format(
                "mean loss {:.4f} over the last {} steps reached the target {:.4f} at step {} "
                "after {:.1f} s: stopping",
                mean, options.loss_window(), *target, summary.steps, *summary.seconds_to_target);
            callback(event);
          }
          break;
        }
      }
    }
    // Whole epochs, and the share of the last one that ran.
    summary.epochs = static_cast<double>(epoch) +
                     (micro.empty() ? 1.0
                                    : static_cast<double>(next) / static_cast<double>(micro.size()));
    if ((options.steps() > 0 && summary.steps >= options.steps()) || summary.target_reached) break;
  }
  summary.seconds = clock.now_s() - start;
  summary.samples_per_s =
      summary.seconds > 0 ? static_cast<double>(summary.samples) / summary.seconds : 0;
  summary.tokens_per_s =
      summary.seconds > 0 ? static_cast<double>(summary.tokens) / summary.seconds : 0;
  summary.token_budget = fixed ? 0 : budget;
  summary.target_tokens = target_tokens;  // 0: fixed batches, a set count a step
  summary.micro_batch_size = fixed ? options.fixed_batch_size() : plan.micro_batch_size;
  summary.accumulation_steps = group_size > 0 ? group_size : 1;
  summary.global_batch_size = summary.steps > 0 ? summary.samples / summary.steps : 0;
  return summary;
}

}  // namespace batchtune
