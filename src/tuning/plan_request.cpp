#include "batchtune/tuning/plan_request.h"

#include <fmt/format.h>

#include <algorithm>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/data/input_spec.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/workload.h"
#include "batchtune/tuning/loader_tuning.h"

namespace batchtune {

void validate(const PlanRequest& r) {
  if (r.micro_batch_size && *r.micro_batch_size < 1) {
    throw OptionError(Option::kBatchSize,
                      fmt::format("must be at least 1, got {}", *r.micro_batch_size));
  }
  if (r.target_batch && *r.target_batch < 1) {
    throw OptionError(Option::kTargetBatch, fmt::format("must be at least 1, got {}", *r.target_batch));
  }
  if (r.base_batch && *r.base_batch < 1) {
    throw OptionError(Option::kBaseBatch, fmt::format("must be at least 1, got {}", *r.base_batch));
  }
  if (r.warmup_steps && *r.warmup_steps < 0) {
    throw OptionError(Option::kWarmup, fmt::format("must be 0 or more steps, got {}", *r.warmup_steps));
  }
  if (r.base_lr && !(*r.base_lr > 0)) {
    throw OptionError(Option::kBaseLr, fmt::format("must be positive, got {}", *r.base_lr));
  }
  if (r.workers && (*r.workers < 0 || *r.workers > kMaxWorkers)) {
    throw OptionError(Option::kWorkers,
                      fmt::format("must be 0 (load on the training thread) to {}, got {}",
                                  kMaxWorkers, *r.workers));
  }
  if (r.prefetch && (*r.prefetch < 0 || *r.prefetch > kMaxPrefetch)) {
    throw OptionError(Option::kPrefetch, fmt::format("must be 0 to {} batches per worker, got {}",
                                                     kMaxPrefetch, *r.prefetch));
  }
  for (const auto& [option, value] : {std::pair{Option::kBatchSize, r.micro_batch_size},
                                      std::pair{Option::kTargetBatch, r.target_batch},
                                      std::pair{Option::kBaseBatch, r.base_batch},
                                      std::pair{Option::kWarmup, r.warmup_steps}}) {
    if (value && *value > kMaxPlanCount) {
      throw OptionError(option, fmt::format("must be at most {}, got {}", kMaxPlanCount, *value));
    }
  }
  for (const auto& [option, value] :
       {std::pair{Option::kBaseLr, r.base_lr}, std::pair{Option::kLr, r.lr}}) {
    if (value && !(*value <= kMaxLearningRate)) {
      throw OptionError(option,
                        fmt::format("must be at most {:g}, got {:g}", kMaxLearningRate, *value));
    }
  }
  if (r.multiple_of && (*r.multiple_of < 1 || *r.multiple_of > kMaxPlanCount)) {
    throw OptionError(Option::kMultipleOf,
                      fmt::format("must be from 1 to {}, got {}", kMaxPlanCount, *r.multiple_of));
  }
  if (r.world_size < 1 || r.world_size > kMaxPlanCount) {
    throw OptionError(Option::kWorldSize, fmt::format("must be from 1 to {}, got {}", kMaxPlanCount,
                                                      r.world_size));
  }
}

PlanWorkload describe_workload(const Workload& workload, const DeviceMemory& memory,
                               const PlanRequest& request) {
  PlanWorkload w;
  w.model = workload.options().model();
  w.input = describe(workload.input_spec());
  w.optimizer = workload.options().optimizer();
  w.base_lr = request.base_lr.value_or(workload.options().lr());
  w.base_batch = request.base_batch.value_or(0);
  w.device = memory.device().str();
  w.memory_limit_bytes = memory.usable_bytes();
  w.parameters = workload.parameter_count();
  return w;
}

std::optional<int64_t> lr_base_batch(const PlanRequest& request) {
  // The default lr is documented for kDefaultBaseBatch; a --base-lr belongs
  // to --base-batch, or to a batch nobody said.
  if (request.base_batch) return *request.base_batch;
  if (request.base_lr) return std::nullopt;
  return kDefaultBaseBatch;
}

namespace {

/// The micro-batch's reason first: the tune's, after the plan's own when the
/// plan took another size to reach its target or multiple.
void put_micro_reason(Plan& plan, const std::string& chosen_reason) {
  if (chosen_reason.empty()) return;
  const std::string own = plan.reason(PlanField::kMicroBatch);
  plan.reasons.erase(std::remove_if(plan.reasons.begin(), plan.reasons.end(),
                                    [](const PlanReason& r) {
                                      return r.field == PlanField::kMicroBatch;
                                    }),
                     plan.reasons.end());
  plan.reasons.insert(plan.reasons.begin(),
                      {PlanField::kMicroBatch,
                       own.empty() ? chosen_reason : own + " (the tune's " + chosen_reason + ")"});
}

/// The plan's warning when nothing says which batch the lr belongs to.
void warn_unscaled_lr(Plan& plan, const std::string& lr_words, const PlanRequest& request) {
  plan.warnings.push_back(fmt::format(
      "lr not scaled: {} belongs to an unknown batch; give {} (the batch it was tuned at) to "
      "scale it to the global batch {}",
      lr_words, option_name(Option::kBaseBatch, request.front_end), plan.global_batch_size));
}

}  // namespace

Plan build_plan(const PlanRequest& request, const MicroBatchChoice& micro, const AmpChoice& amp,
                const Workload& workload, const DeviceMemory& memory) {
  validate(request);
  const bool cuda = memory.device().is_cuda();
  const auto name = [&](Option option) { return option_name(option, request.front_end); };
  OptionSources sources = request.sources;
  PlanOptions options;
  options.front_end(request.front_end)
      .micro_batch_size(micro.size)
      .speeds(micro.speeds)
      .speed_tolerance(micro.tolerance)
      .multiple_of(request.multiple_of.value_or(1))
      .world_size(request.world_size)
      .optimizer(workload.options().optimizer())
      .amp(amp.mode)
      .amp_reason(amp.reason)
      .pin_memory(cuda);
  std::string pipeline_why;
  if (!request.plan_file.empty()) {
    // The file's values, each overridden by what the request sets.
    const Plan file = read_plan_file(request.plan_file);
    const std::string from = "the plan " + request.plan_file;
    if (!request.target_batch) sources.emplace(Option::kTargetBatch, from + "'s global batch");
    if (!request.base_lr) sources.emplace(Option::kBaseLr, from);
    if (!request.lr_scaling) sources.emplace(Option::kLrScaling, from);
    if (!request.warmup_steps) sources.emplace(Option::kWarmup, from);
    options.target_batch(request.target_batch.value_or(file.global_batch_size))
        .base_lr(request.base_lr.value_or(file.lr))
        .base_batch(request.base_batch.value_or(file.global_batch_size))
        .lr_scaling(lr_scaling_name(request.lr_scaling.value_or(file.lr_scaling)))
        .warmup_steps(request.warmup_steps.value_or(file.warmup_steps))
        .workers(file.workers)
        .pin_memory(file.pin_memory)
        .prefetch(file.prefetch);
    pipeline_why = "from " + from;
  } else {
    const int64_t base_batch = lr_base_batch(request).value_or(0);
    if (!request.base_lr) {
      sources.emplace(Option::kBaseLr,
                      request.base_batch ? name(Option::kLr)
                                         : fmt::format("the default {}, known for batch {}",
                                                       name(Option::kLr), kDefaultBaseBatch));
    }
    options.target_batch(request.target_batch.value_or(0))
        .base_lr(request.base_lr.value_or(workload.options().lr()))
        .base_batch(base_batch)
        .lr_scaling(request.lr_scaling ? lr_scaling_name(*request.lr_scaling) : "")
        .warmup_steps(request.warmup_steps.value_or(-1));
  }
  options.sources(sources);
  if (request.workers) options.workers(*request.workers);
  if (request.prefetch) options.prefetch(*request.prefetch);
  if (request.pin_memory) options.pin_memory(*request.pin_memory);
  // Pinned memory speeds host-to-device copies; the CPU copies nothing.
  if (!cuda) options.pin_memory(false);
  Plan plan = make_plan(options);
  if (request.workers || request.prefetch || request.pin_memory) pipeline_why = "as asked";
  set_pipeline_reason(plan, !cuda ? "pinned memory does not apply on the CPU (no copy to a device)"
                                  : pipeline_why);
  put_micro_reason(plan, micro.reason);
  if (request.lr) {
    plan.lr = *request.lr;
    plan.lr_scaling = LrScaling::kNone;  // as asked, not scaled
    plan.set_reason(PlanField::kLr, fmt::format("lr {:.6g}: {} (not scaled)", plan.lr,
                                                as_asked(Option::kLr, request.front_end,
                                                         request.sources)));
  } else if (options.base_batch() == 0) {
    warn_unscaled_lr(plan,
                     fmt::format("{} {:g}", option_source(Option::kBaseLr, request.front_end, sources),
                                 options.base_lr()),
                     request);
  }
  plan.workload = describe_workload(workload, memory, request);
  if (workload.options().checkpointing()) {
    plan.checkpointing = true;
    plan.reasons.push_back(
        {PlanField::kNote, fmt::format("activation checkpointing on: {} (the micro-batch was "
                                       "measured with it)",
                                       as_asked(Option::kCheckpointing, request.front_end,
                                                request.sources))});
  }
  plan.workload.base_batch =
      options.base_batch() > 0 ? options.base_batch() : plan.global_batch_size;
  return plan;
}

Plan build_subject_plan(const PlanRequest& request, const MicroBatchChoice& micro,
                        const AmpChoice& amp, bool cuda) {
  OptionSources sources = request.sources;
  if (!request.base_lr) sources.emplace(Option::kBaseLr, "the optimizer's lr");
  PlanOptions o;
  o.front_end(request.front_end)
      .sources(sources)
      .micro_batch_size(micro.size)
      .speeds(micro.speeds)
      .speed_tolerance(micro.tolerance)
      .multiple_of(request.multiple_of.value_or(1))
      .world_size(request.world_size)
      .target_batch(request.target_batch.value_or(0))
      .base_lr(request.base_lr.value_or(1e-3))
      .base_batch(request.base_batch.value_or(0))
      .lr_scaling(request.lr_scaling ? lr_scaling_name(*request.lr_scaling) : "")
      .warmup_steps(request.warmup_steps.value_or(-1))
      .amp(amp.mode)
      .amp_reason(amp.reason)
      .pin_memory(cuda);
  if (request.optimizer) o.optimizer(*request.optimizer);
  Plan plan = make_plan(o);
  put_micro_reason(plan, micro.reason);
  if (!request.base_batch) {
    warn_unscaled_lr(plan, fmt::format("the lr {:g}", o.base_lr()), request);
  }
  // The caller feeds its own batches (a Python DataLoader): nothing here
  // timed worker counts, and no loader here could.
  set_pipeline_reason(plan, "the defaults, not timed: the batches came from the caller's own "
                            "loader");
  return plan;
}

std::string micro_batch_reason(int64_t micro_batch_size, const std::string& why,
                               std::optional<int64_t> rank_max_batch, int64_t job_max_batch) {
  std::string reason = fmt::format("micro-batch {}: {}", micro_batch_size, why);
  if (rank_max_batch && *rank_max_batch != job_max_batch) {
    reason += fmt::format("; the largest batch is {} on this rank, {} on the smallest",
                          *rank_max_batch, job_max_batch);
  }
  return reason;
}

}  // namespace batchtune
