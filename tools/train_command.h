#pragma once

// What the two paths of `batchtune train` share: train_command.cpp (image
// data, and the command's flags) and train_text_command.cpp (`--data
// text:DIR`, by token budget).

#include <CLI/CLI.hpp>

#include <cstdint>
#include <ostream>
#include <string>

#include "batchtune/training/batch_adapter.h"
#include "data_flags.h"
#include "distributed_flags.h"
#include "plan_flags.h"
#include "workload_flags.h"

namespace batchtune::cli {

struct TrainFlags {
  WorkloadFlags workload;
  PlanFlags plan;
  DistributedFlags distributed;
  DataFlags data;
  int64_t epochs = 1;
  int64_t steps = 0;
  int64_t log_every = 100;
  std::string checkpoint;
  int64_t checkpoint_every = 0;
  int64_t target_tokens = 0;
  int64_t eval_every = 0;
  int64_t eval_every_samples = 0;
  // Set when the flag is given (`CLI::App::count`).
  double target_accuracy = 0;
  double target_loss = 0;
  double time_limit = 0;  // seconds; 0: none
  bool resume = false;
  bool memory_summary = false;
  bool no_noise_scale = false;
  bool adapt = false;
  int64_t adapt_every = kDefaultAdaptEvery;
  int64_t adapt_max_batch = 0;
  int64_t adapt_min_batch = 0;
  std::string adapt_lr = "gain";
  std::string json;
};

/// An interrupt during the quick tune: says so, writes the summary of a
/// run that trained nothing to `json` (when given), and returns the exit code.
int interrupted_during_tune(std::ostream& out, const std::string& json);

/// `--data text:DIR`: byte tokens by the plan's token budget (or, with
/// `--batch-size`, fixed batches padded to the longest sequence).
int run_train_text(const TrainFlags& flags, const CLI::App& cmd, WorkloadFlags workload_flags,
                   PlanRequest request);

}  // namespace batchtune::cli
