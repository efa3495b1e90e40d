#include "plan_flags.h"

#include <fmt/format.h>


#include "batchtune/common/error.h"
#include "batchtune/step/amp.h"

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
                 fmt::format("batch size the lr belongs to; the lr is scaled from it to the "
                             "global batch (default: {} for the default --lr; a --base-lr "
                             "without it is not scaled)",
                             kDefaultBaseBatch));
  app.add_option("--multiple-of", flags.multiple_of,
                 "round the micro-batch down to a multiple of N (8 for tensor cores)");
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

PlanRequest plan_request(const PlanFlags& flags, const CLI::App& app, double lr) {
  check_plan_flags(flags, app);
  const auto given = [&](const char* name) { return app.count(name) > 0; };
  PlanRequest r;
  if (given("--batch-size")) r.micro_batch_size = flags.batch_size;
  r.plan_file = flags.plan_file;
  if (given("--target-batch")) r.target_batch = flags.target_batch;
  if (given("--base-lr")) r.base_lr = flags.base_lr;
  if (given("--base-batch")) r.base_batch = flags.base_batch;
  if (given("--multiple-of")) r.multiple_of = flags.multiple_of;
  if (given("--lr-scaling")) r.lr_scaling = parse_lr_scaling(flags.lr_scaling);
  if (given("--warmup")) r.warmup_steps = flags.warmup;
  // `--amp auto` given asks for auto even over a plan file's precision.
  if (given("--amp") || flags.plan_file.empty()) r.amp = parse_amp(flags.amp);
  if (given("--workers")) r.workers = flags.workers;
  if (given("--prefetch")) r.prefetch = flags.prefetch;
  if (flags.pin_memory != "auto") r.pin_memory = flags.pin_memory == "on";
  if (given("--lr")) r.lr = lr;
  validate(r);
  return r;
}

}  // namespace batchtune::cli
