#pragma once

// The flags that make a plan, shared by `plan`, `tune` and `train`, and the
// request they stand for (see batchtune/tuning/plan_request.h).

#include <CLI/CLI.hpp>

#include <string>

#include "batchtune/plan/plan.h"
#include "batchtune/tuning/plan_request.h"

namespace batchtune::cli {

struct PlanFlags {
  int64_t batch_size = 0;
  std::string plan_file;
  int64_t target_batch = 0;
  double base_lr = 1e-3;
  int64_t base_batch = 0;
  int64_t multiple_of = 1;
  std::string lr_scaling;
  int64_t warmup = -1;
  std::string amp = "auto";
  int64_t workers = 0;
  int64_t prefetch = kDefaultPrefetch;
  std::string pin_memory = "auto";
};

void add_plan_flags(CLI::App& app, PlanFlags& flags);

/// Checks every plan flag's range (before any work). Throws
/// `batchtune::Error` naming the flag.
void check_plan_flags(const PlanFlags& flags, const CLI::App& app);

/// The request the flags given on `app` make (a flag left out is a field
/// left empty), checked with `check_plan_flags`; `--lr` given asks for that
/// exact lr. Throws
/// `batchtune::Error` naming the flag.
PlanRequest plan_request(const PlanFlags& flags, const CLI::App& app, double lr);

}  // namespace batchtune::cli
