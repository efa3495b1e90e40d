#pragma once

// The flags that make a plan, shared by `plan` and `train`, and how they
// resolve into one (from a plan file, a fixed batch size, or a quick tune).

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

#include "batchtune/memory/device_memory.h"
#include "batchtune/plan/plan.h"
#include "batchtune/tuning/search.h"
#include "batchtune/step/workload.h"

namespace batchtune::cli {

struct PlanFlags {
  int64_t batch_size = 0;
  std::string plan_file;
  int64_t target_batch = 0;
  double base_lr = 1e-3;
  int64_t base_batch = 0;
  std::string lr_scaling;
  int64_t warmup = -1;
  std::string amp = "auto";
  /// Processes of the job (set by the command, not a flag): the plan's
  /// world size; a plan file's global batch is kept across world sizes.
  int64_t world_size = 1;
  /// Data parallel: what all ranks agree on for a quick-tuned micro-batch
  /// (the minimum over ranks); none for one process.
  std::function<int64_t(int64_t)> agree_batch;
  int64_t workers = 0;
  int64_t prefetch = kDefaultPrefetch;
  std::string pin_memory = "auto";
};

/// On the CPU `amp auto` times bf16 against fp32 at this micro-batch at
/// most: the ratio is what matters, and a 12x slower bf16 step at a large
/// batch would cost more than the decision is worth.
constexpr int64_t kAmpProbeMaxBatch = 32;

void add_plan_flags(CLI::App& app, PlanFlags& flags);

/// Checks every plan flag's range (before any work: `resolve_plan` runs
/// after a tune's search). Throws `batchtune::Error` naming the flag.
void check_plan_flags(const PlanFlags& flags, const CLI::App& app);

/// The plan the flags ask for. `app` tells which flags were given (they
/// override a plan file's values; `--lr` given sets the lr exactly). The
/// micro-batch is `tuned_batch` when positive (from `tune`, with its reason),
/// else `--batch-size`, else a quick tune up to `max_batch`. Throws
/// `batchtune::Error` naming the flag.
Plan resolve_plan(const PlanFlags& flags, const CLI::App& app, Workload& workload,
                  DeviceMemory& memory, int64_t max_batch = kDefaultMaxBatch,
                  int64_t tuned_batch = 0, std::string tuned_reason = {});

}  // namespace batchtune::cli
