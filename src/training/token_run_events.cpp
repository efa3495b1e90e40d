// A token-budget run's reports: its log lines and the moving mean loss that
// stops it at `--target-loss`.
#include <fmt/format.h>

#include <algorithm>

#include "batchtune/memory/device_memory.h"
#include "token_run.h"

namespace batchtune {

void TokenRun::log(double loss_mean, double lr, const std::vector<TokenBatch>& group) {
  TrainEvent event;
  event.kind = TrainEvent::Kind::kLog;
  event.step = summary_.steps;
  event.total_steps = run_.steps();
  event.epoch = epoch_;
  event.loss = loss_mean;
  event.lr = lr;
  const double seconds = clock_.now_s() - start_s_;
  event.samples_per_s = seconds > 0 ? static_cast<double>(summary_.samples) / seconds : 0;
  event.memory_used_bytes = memory_.live_bytes();
  event.memory_peak_bytes = memory_.peak_bytes();
  event.memory_capacity_bytes = memory_.capacity_bytes();
  event.noise_scale = step_.noise_scale().noise_scale();
  // The step's micro-batches, and the largest in padded tokens.
  event.accumulation_steps = static_cast<int64_t>(group.size());
  for (const auto& b : group) {
    event.micro_batch_size = std::max(
        event.micro_batch_size,
        source_->padded_tokens(b));
  }
  event.message = fmt::format("{:.0f} tokens/s, token budget {}",
                              seconds > 0 ? static_cast<double>(summary_.tokens) / seconds : 0,
                              source_->budget());
  emit(event);
}

bool TokenRun::reached_target(double loss) {
  if (!loss_target_->add(loss)) return false;
  summary_.target_reached = true;
  summary_.steps_to_target = summary_.steps;
  summary_.seconds_to_target = clock_.now_s() - start_s_;
  summary_.samples_to_target = summary_.samples;
  TrainEvent event;
  event.kind = TrainEvent::Kind::kTargetReached;
  event.step = summary_.steps;
  event.epoch = epoch_;
  event.loss = loss_target_->mean();
  event.message = loss_target_->reached_message(summary_.steps, *summary_.seconds_to_target);
  emit(event);
  return true;
}

}  // namespace batchtune
