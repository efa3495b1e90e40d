#include "batchtune/tuning/resolve_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/common/option.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/workload.h"
#include "batchtune/tuning/tune.h"

namespace batchtune {

Plan resolve_plan(const PlanRequest& request, Workload& workload, DeviceMemory& memory,
                  int64_t max_batch, TuneReporter* reporter, DataParallel* data_parallel,
                  StopRequest stop, const Dataset* data, std::vector<SweepRow>* sweep) {
  validate(request);
  if (sweep != nullptr) sweep->clear();
  const auto name = [&](Option option) { return option_name(option, request.front_end); };
  const PlanWorkload current = describe_workload(workload, memory, request);
  if (!request.plan_file.empty()) {
    const Plan file = read_plan_file(request.plan_file);
    const std::string source =
        (request.front_end == FrontEnd::kCli ? "--plan " : "the plan ") + request.plan_file;
    check_plan_workload(file.workload, current, source, request.front_end);
    if (file.checkpointing && !workload.options().checkpointing()) {
      // Its micro-batch fits only with the activations it does not keep.
      throw Error(fmt::format("{}: the plan was tuned with activation checkpointing on, this run "
                              "has it off; give {} on, or make a plan without it (batchtune tune)",
                              source, name(Option::kCheckpointing)));
    }
    AmpChoice amp{file.amp, fmt::format("amp {}: from the plan {}", amp_name(file.amp),
                                        request.plan_file)};
    if (request.amp) {
      amp = choose_amp(*request.amp, workload, memory,
                       std::min(request.micro_batch_size.value_or(file.micro_batch_size),
                                kAmpProbeMaxBatch),
                       request.front_end);
      if (amp.mode != file.amp) {
        amp.reason += fmt::format(" ({} overrides the plan's {})", name(Option::kAmp),
                                  amp_name(file.amp));
      }
    }
    const int64_t micro = request.micro_batch_size.value_or(file.micro_batch_size);
    const std::string micro_reason =
        request.micro_batch_size
            ? fmt::format("micro-batch {}: {} (the plan {} has {})", micro,
                          as_asked(Option::kBatchSize, request.front_end, request.sources),
                          request.plan_file, file.micro_batch_size)
            : fmt::format("micro-batch {}: from the plan {}", micro, request.plan_file);
    Plan plan = build_plan(request, {micro, micro_reason, {}, kDefaultThroughputTolerance}, amp,
                           workload, memory);
    if (file.eval_micro_batch_size > 0 && amp.mode == file.amp) {
      // Measured at the file's precision: at another, evaluation runs at
      // the micro-batch.
      plan.eval_micro_batch_size = std::max(file.eval_micro_batch_size, plan.micro_batch_size);
      plan.set_reason(PlanField::kEvalBatch,
                      fmt::format("eval batch {}: from the plan {}", plan.eval_micro_batch_size,
                                  request.plan_file));
    }
    if (file.token_budget > 0) {
      plan.token_budget = file.token_budget;
      plan.length_buckets = file.length_buckets;
      plan.set_reason(PlanField::kTokenBudget,
                      fmt::format("token budget {}: from the plan {}", file.token_budget,
                                  request.plan_file));
    }
    return plan;
  }
  if (request.micro_batch_size) {
    const int64_t micro = *request.micro_batch_size;
    const AmpChoice amp = choose_amp(request.amp.value_or(AmpMode::kAuto), workload, memory,
                                     std::min(micro, kAmpProbeMaxBatch), request.front_end);
    return build_plan(request,
                      {micro,
                       fmt::format("micro-batch {}: {}", micro,
                                   as_asked(Option::kBatchSize, request.front_end, request.sources)),
                       {}, kDefaultThroughputTolerance},
                      amp, workload, memory);
  }
  // Neither: a quick tune finds the micro-batch at the precision it trains with.
  TuneOptions options = quick_tune_options(request, max_batch, data);
  options.data_parallel(data_parallel).stop(std::move(stop));
  TuneResult tuned = tune(workload, memory, options, reporter);
  if (!tuned.complete) throw Interrupted();
  if (!tuned.plan) {
    throw OptionError(Option::kBatchSize,
                      fmt::format("the quick tune found no micro-batch ({}); give one",
                                  tuned.search.stop_reason));
  }
  if (sweep != nullptr) *sweep = tuned.sweep;
  Plan plan = *tuned.plan;
  if (plan.micro_batch_size == tuned.selection.batch_size) {
    plan.set_reason(PlanField::kMicroBatch,
                    fmt::format("micro-batch {}: tuned — largest that fits {} ({}); {}",
                                plan.micro_batch_size, tuned.search.max_batch_size,
                                tuned.search.stop_reason, tuned.selection.reason));
  }
  return plan;
}

}  // namespace batchtune
