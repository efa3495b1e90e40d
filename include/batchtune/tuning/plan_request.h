#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/plan/plan.h"
#include "batchtune/step/amp.h"

namespace batchtune {

class DeviceMemory;
class Workload;

/// What was asked of a plan. A field left empty is chosen: read from the
/// plan file, found by a tune, or set by the plan's rules. The CLI fills it
/// from its flags (a flag given is a field set); a library caller sets what
/// it wants.
struct PlanRequest {
  /// The micro-batch (`--batch-size`); empty: from the plan file or a tune.
  std::optional<int64_t> micro_batch_size;
  /// A plan to start from (`--plan`); every field set here overrides its value.
  std::string plan_file;
  std::optional<int64_t> target_batch;
  std::optional<double> base_lr;
  std::optional<int64_t> base_batch;
  std::optional<LrScaling> lr_scaling;
  std::optional<int64_t> warmup_steps;
  /// Mixed precision; empty: the plan file's, else `auto`.
  std::optional<AmpMode> amp;
  std::optional<int64_t> workers;
  std::optional<int64_t> prefetch;
  /// Pinned staging memory; empty: on for CUDA (it never applies on a CPU).
  std::optional<bool> pin_memory;
  /// The micro-batch rounded down to a multiple of this (`--multiple-of`).
  std::optional<int64_t> multiple_of;
  /// An exact learning rate (`--lr`), not scaled with the global batch.
  std::optional<double> lr;
  /// Processes of the job: the plan's world size. A tune over several
  /// processes (`TuneOptions::data_parallel`) plans for its group's size.
  int64_t world_size = 1;
  /// The optimizer's kind (`adam`, `adamw`, `sgd`: its default lr scaling)
  /// for a tune over a trial subject without a `Workload` (the Python
  /// package's); a workload's plan takes the workload's own.
  std::optional<std::string> optimizer;
  /// Sequences of varying length: the training data's mean sample length
  /// (tokens). A token-budget plan then scales its lr to the samples a step
  /// of `Plan::tokens_per_step` holds on average, and a `target_batch`
  /// (samples) sets the tokens per step; empty: the lr belongs to the
  /// micro-batch at the longest length.
  std::optional<double> mean_length;
  /// Who asked: the plan's reasons name options as this front end does.
  /// `resolve` sets it from `TuneOptions::front_end`.
  FrontEnd front_end = FrontEnd::kCli;
  /// Where values the caller did not give as their option came from ("the
  /// optimizer's lr", "the Trainer's precision 'bf16-mixed'"), said by the
  /// reasons instead of the option's name (see `PlanOptions::sources`).
  OptionSources sources;
};

/// Checks the request's values for range; throws `batchtune::Error` naming
/// the flag.
void validate(const PlanRequest& request);

/// What `workload` on `memory` is, as a plan records it.
PlanWorkload describe_workload(const Workload& workload, const DeviceMemory& memory,
                               const PlanRequest& request);

/// The batch the request's lr belongs to: `--base-batch`, else
/// `kDefaultBaseBatch` for the workload's default lr; nullopt for a
/// `--base-lr` without `--base-batch` (then the lr is not scaled).
std::optional<int64_t> lr_base_batch(const PlanRequest& request);

/// A micro-batch already chosen, what it was chosen from, and why.
struct MicroBatchChoice {
  int64_t size = 0;
  std::string reason;
  /// The sweep's rows: what a smaller micro-batch that reaches the target
  /// batch exactly costs (see `PlanOptions::target_batch`).
  std::vector<MeasuredSpeed> speeds;
  double tolerance = 0.02;  /// as the throughput objective's default
};

/// The plan `request` asks for around a micro-batch already chosen, at
/// precision `amp` (resolved), the rest from the request and its plan file,
/// for `workload` on `memory`. Every reason says where its value came from.
/// The lr belongs to `--base-batch`, else (the default lr) to
/// `kDefaultBaseBatch`; a `--base-lr` without `--base-batch` is not scaled,
/// and the plan warns.
Plan build_plan(const PlanRequest& request, const MicroBatchChoice& micro, const AmpChoice& amp,
                const Workload& workload, const DeviceMemory& memory);

/// The same for a trial subject without a `Workload` (the Python package's):
/// no plan file and no workload record; the optimizer's kind is the
/// request's `optimizer`, the world size its `world_size`, and staging memory
/// pinned on CUDA (`cuda`). Without `base_batch` the lr is not scaled, and
/// the plan warns.
Plan build_subject_plan(const PlanRequest& request, const MicroBatchChoice& micro,
                        const AmpChoice& amp, bool cuda);

/// Why the micro-batch is `micro_batch_size`: `why`, and, when this rank
/// fits more than the job's smallest (`rank_max_batch`), both figures.
std::string micro_batch_reason(int64_t micro_batch_size, const std::string& why,
                               std::optional<int64_t> rank_max_batch, int64_t job_max_batch);

}  // namespace batchtune
