#include "plan_flags.h"

#include <fmt/format.h>

#include <algorithm>

#include "batchtune/step/amp.h"
#include "batchtune/common/error.h"
#include "batchtune/tuning/loader_tuning.h"
#include "batchtune/tuning/quick_tune.h"

namespace batchtune::cli {

void add_plan_flags(CLI::App& app, PlanFlags& flags) {
  app.add_option("--batch-size", flags.batch_size,
                 "micro-batch: samples per forward/backward (default: a quick tune finds it)");
  app.add_option("--plan", flags.plan_file,
                 "plan JSON to use (from batchtune plan/tune); other plan flags override it");
  app.add_option("--target-batch", flags.target_batch,
                 "logical (global) batch to reach by gradient accumulation");
  app.add_option("--base-lr", flags.base_lr, "learning rate known to work at --base-batch")
      ->capture_default_str();
  app.add_option("--base-batch", flags.base_batch,
                 "batch size --base-lr belongs to (default: the micro-batch)");
  app.add_option("--lr-scaling", flags.lr_scaling,
                 "linear, sqrt or none (default: linear for sgd, sqrt for adam/adamw)");
  app.add_option("--warmup", flags.warmup,
                 fmt::format("warm-up optimizer steps (default: {} per doubling of the lr)",
                             kWarmupStepsPerLrDoubling));
  app.add_option("--amp", flags.amp,
                 "mixed precision: off, bf16, fp16 or auto (measured on CPU, by compute "
                 "capability on CUDA)")
      ->capture_default_str();
  app.add_option("--workers", flags.workers,
                 "input pipeline: threads building batches (0: on the training thread)")
      ->capture_default_str();
  app.add_option("--prefetch", flags.prefetch, "input pipeline: batches built ahead per worker")
      ->capture_default_str();
  app.add_option("--pin-memory", flags.pin_memory,
                 "input pipeline: stage batches in pinned host memory: auto (on for CUDA), on "
                 "or off; does not apply on the CPU")
      ->capture_default_str();
}

void check_plan_flags(const PlanFlags& flags, const CLI::App& app) {
  const auto given = [&](const char* name) { return app.count(name) > 0; };
  if (given("--batch-size") && flags.batch_size < 1) {
    throw Error(fmt::format("--batch-size: must be at least 1, got {}", flags.batch_size));
  }
  if (given("--target-batch") && flags.target_batch < 1) {
    throw Error(fmt::format("--target-batch: must be at least 1, got {}", flags.target_batch));
  }
  if (given("--base-batch") && flags.base_batch < 1) {
    throw Error(fmt::format("--base-batch: must be at least 1, got {}", flags.base_batch));
  }
  if (given("--warmup") && flags.warmup < 0) {
    throw Error(fmt::format("--warmup: must be 0 or more steps, got {}", flags.warmup));
  }
  if (given("--base-lr") && !(flags.base_lr > 0)) {
    throw Error(fmt::format("--base-lr: must be positive, got {}", flags.base_lr));
  }
  if (given("--lr-scaling")) parse_lr_scaling(flags.lr_scaling);
  if (flags.workers < 0 || flags.workers > kMaxWorkers) {
    throw Error(fmt::format("--workers: must be 0 (load on the training thread) to {}, got {}",
                            kMaxWorkers, flags.workers));
  }
  if (flags.prefetch < 0 || flags.prefetch > kMaxPrefetch) {
    throw Error(fmt::format("--prefetch: must be 0 to {} batches per worker, got {}",
                            kMaxPrefetch, flags.prefetch));
  }
  for (const char* name : {"--batch-size", "--target-batch", "--base-batch", "--warmup"}) {
    const int64_t value = std::string(name) == "--batch-size"     ? flags.batch_size
                          : std::string(name) == "--target-batch" ? flags.target_batch
                          : std::string(name) == "--base-batch"   ? flags.base_batch
                                                                  : flags.warmup;
    if (given(name) && value > kMaxPlanCount) {
      throw Error(fmt::format("{}: must be at most {}, got {}", name, kMaxPlanCount, value));
    }
  }
  if (given("--base-lr") && !(flags.base_lr <= kMaxLearningRate)) {
    throw Error(fmt::format("--base-lr: must be at most {:g}, got {:g}", kMaxLearningRate,
                            flags.base_lr));
  }
  if (flags.pin_memory != "auto" && flags.pin_memory != "on" && flags.pin_memory != "off") {
    throw Error(fmt::format("--pin-memory: use auto, on or off, not '{}'", flags.pin_memory));
  }
  parse_amp(flags.amp);
}

Plan resolve_plan(const PlanFlags& flags, const CLI::App& app, Workload& workload,
                  DeviceMemory& memory, int64_t max_batch, int64_t tuned_batch,
                  std::string tuned_reason) {
  check_plan_flags(flags, app);
  const auto given = [&](const char* name) { return app.count(name) > 0; };
  const AmpMode amp_asked = parse_amp(flags.amp);

  PlanOptions options;
  options.optimizer(workload.options().optimizer())
      .target_batch(flags.target_batch)
      .base_lr(given("--base-lr") ? flags.base_lr : workload.options().lr())
      .base_batch(flags.base_batch)
      .lr_scaling(flags.lr_scaling)
      .warmup_steps(flags.warmup)
      .pin_memory(memory.device().is_cuda());

  if (!flags.plan_file.empty()) {
    const Plan file = read_plan_file(flags.plan_file);
    options.micro_batch_size(given("--batch-size") ? flags.batch_size : file.micro_batch_size)
        .world_size(flags.world_size)
        .target_batch(given("--target-batch") ? flags.target_batch : file.global_batch_size)
        .base_lr(given("--base-lr") ? flags.base_lr : file.lr)
        .base_batch(given("--base-batch") ? flags.base_batch : file.global_batch_size)
        .lr_scaling(given("--lr-scaling") ? flags.lr_scaling : lr_scaling_name(file.lr_scaling))
        .warmup_steps(given("--warmup") ? flags.warmup : file.warmup_steps)
        .workers(file.workers)
        .pin_memory(file.pin_memory)
        .prefetch(file.prefetch);
    if (given("--amp")) {
      const AmpChoice amp = choose_amp(
          amp_asked, workload, memory, std::min(options.micro_batch_size(), kAmpProbeMaxBatch));
      options.amp(amp.mode).amp_reason(amp.reason);
    } else {
      options.amp(file.amp).amp_reason(
          fmt::format("amp {}: from {}", amp_name(file.amp), flags.plan_file));
    }
  } else {
    int64_t micro = flags.batch_size;
    if (tuned_batch > 0) {
      micro = tuned_batch;
    } else if (!given("--batch-size")) {
      // A quick tune finds the micro-batch; the flags fill in the rest.
      const TunedBatch tuned = quick_tune(workload, memory, max_batch);
      micro = tuned.batch_size;
      tuned_reason = tuned.reason;
      if (flags.agree_batch) {
        const int64_t agreed = flags.agree_batch(micro);
        if (agreed != micro) {
          tuned_reason += fmt::format("; {} on another rank: the smallest is taken", agreed);
          micro = agreed;
        }
      }
    }
    options.micro_batch_size(micro).world_size(flags.world_size);
    const AmpChoice amp =
        choose_amp(amp_asked, workload, memory, std::min(micro, kAmpProbeMaxBatch));
    options.amp(amp.mode).amp_reason(amp.reason);
  }
  if (given("--workers")) options.workers(flags.workers);
  if (given("--prefetch")) options.prefetch(flags.prefetch);
  if (given("--pin-memory") && flags.pin_memory != "auto") {
    options.pin_memory(flags.pin_memory == "on");
  }
  // Pinned memory speeds host-to-device copies; the CPU copies nothing.
  const bool cpu = !memory.device().is_cuda();
  if (cpu) options.pin_memory(false);
  Plan plan = make_plan(options);
  set_pipeline_reason(plan, cpu ? "pinned memory does not apply on the CPU (no copy to a "
                                  "device)"
                                : "");
  if (!tuned_reason.empty()) plan.reasons.insert(plan.reasons.begin(), tuned_reason);
  if (given("--lr")) {
    plan.lr = workload.options().lr();
    plan.lr_scaling = LrScaling::kNone;  // as asked, not scaled
    for (auto& reason : plan.reasons) {
      if (reason.rfind("lr ", 0) == 0) {
        reason = fmt::format("lr {:.6g}: as asked with --lr (not scaled)", plan.lr);
      }
    }
  }
  return plan;
}

}  // namespace batchtune::cli
