#pragma once

#include <nlohmann/json.hpp>
#include <torch/arg.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/common/counts.h"
#include "batchtune/common/option.h"
#include "batchtune/common/precision.h"
#include "batchtune/data/length_bucket.h"
#include "batchtune/data/loader_limits.h"

namespace batchtune {

/// How the learning rate follows the global batch: `lr = base_lr × f(global
/// / base_batch)` with f the identity (`linear`, Goyal et al. 2017, for SGD),
/// the square root (`sqrt`, for the Adam family, whose update is already
/// normalised per parameter) or 1 (`none`).
enum class LrScaling { kLinear, kSqrt, kNone };

std::string lr_scaling_name(LrScaling scaling);
/// Parses `linear|sqrt|none`; throws `batchtune::Error` naming `what`.
LrScaling parse_lr_scaling(const std::string& text, const std::string& what = "--lr-scaling");
/// The default for an optimizer: linear for `sgd`, sqrt for `adam`/`adamw`.
LrScaling default_lr_scaling(const std::string& optimizer);

/// The warm-up rule: `kWarmupStepsPerLrDoubling` optimizer steps for every
/// doubling of the learning rate over the base one, none when it is not
/// raised. Larger scale factors, which are less stable early, warm up longer.
constexpr int64_t kWarmupStepsPerLrDoubling = 20;

/// Learning rates above this are typos (and past float32's range they are
/// inf inside the optimizer).
constexpr double kMaxLearningRate = 1e3;

/// The batch the default learning rate belongs to, for the CLI's workloads:
/// `--lr`'s default (1e-3, Adam) is the one known to train the built-in
/// models well at a batch of 64, so a plan that takes a larger global batch
/// scales it from there (`--base-batch` says otherwise).
constexpr int64_t kDefaultBaseBatch = 64;

/// A micro-batch smaller than the chosen one is taken to reach a target
/// global batch exactly only down to this share of it when no measured
/// speeds say what it costs.
constexpr double kUnmeasuredMicroBatchShare = 0.5;

/// What a plan reason explains: each value of a plan has one reason, which
/// says where the value came from.
enum class PlanField {
  kMicroBatch,
  kGlobalBatch,
  kLr,
  kWarmup,
  kAmp,
  kInputPipeline,
  kTokenBudget,
  kEvalBatch,
  kNote,  ///< anything else (a reason read from a file, a remark)
};

/// A measured speed at one micro-batch (a sweep row): what a smaller
/// micro-batch costs, for the plan that takes one to reach its target.
struct MeasuredSpeed {
  int64_t batch_size = 0;
  double samples_per_s = 0;
};

/// One plain sentence saying why a plan value is what it is.
struct PlanReason {
  PlanField field = PlanField::kNote;
  std::string text;
};

/// What a plan was measured on: `train --plan` refuses a plan made for
/// another workload, naming the field (see `check_plan_workload`). Empty
/// strings and zeros stand for "not recorded" (a plan written by hand or by
/// an older batchtune), which is never a mismatch.
struct PlanWorkload {
  std::string model;        ///< `--model`: a built-in name or a TorchScript file
  std::string input;        ///< the input spec, as `describe(InputSpec)` writes it
  std::string optimizer;    ///< `adam`, `adamw`, `sgd`
  double base_lr = 0;       ///< the lr known to work at `base_batch`
  int64_t base_batch = 0;
  std::string device;       ///< `cpu`, `cuda:0`
  int64_t memory_limit_bytes = 0;  ///< the usable budget the micro-batch was measured under
  /// Parameter elements of the model: `gpt` of 37,344 and of 149,248 share
  /// the name, not the memory.
  int64_t parameters = 0;
  bool empty() const { return model.empty(); }
};

/// How to train: the batch sizes, learning rate and precision that move
/// together. `batchtune tune` ends with one; `batchtune plan` and
/// `batchtune train --plan FILE` read it. JSON field names are stable.
struct Plan {
  int64_t micro_batch_size = 1;   ///< samples per forward/backward
  int64_t accumulation_steps = 1; ///< micro-batches per optimizer step
  int64_t world_size = 1;         ///< processes training together
  int64_t global_batch_size = 1;  ///< micro × accumulation × world size
  double lr = 1e-3;               ///< learning rate after warm-up
  LrScaling lr_scaling = LrScaling::kSqrt;
  int64_t warmup_steps = 0;       ///< optimizer steps of linear warm-up
  AmpMode amp = AmpMode::kOff;    ///< never kAuto
  int64_t workers = kDefaultWorkers;
  bool pin_memory = false;
  int64_t prefetch = kDefaultPrefetch;
  /// Sequences of varying length (`int64:16..512`): padded tokens per
  /// micro-batch at most, a budget that fits at every length up to the
  /// longest; 0 for a plan of fixed batches. JSON `token_budget`, written
  /// only when set.
  int64_t token_budget = 0;
  /// With a token budget: the buckets by length, shortest first, each with
  /// the micro-batch that fits at its bound. JSON `length_buckets`.
  std::vector<LengthBucket> length_buckets;
  /// With a token budget: real tokens per optimizer step over every
  /// process, reached by accumulating micro-batches (the budget on each
  /// process by default). JSON `tokens_per_step`, written with the budget;
  /// 0 in a plan file that has none (then the budget on each process).
  int64_t tokens_per_step = 0;
  /// Activation checkpointing: the model's blocks recompute their
  /// activations in the backward pass instead of keeping them (a larger
  /// batch, for one more forward pass). JSON `checkpointing` ("on"), written
  /// only when on, with `checkpoint_modules`: the classes recomputed (none:
  /// the model's own switch, a Hugging Face model's
  /// `gradient_checkpointing_enable()`).
  bool checkpointing = false;
  std::vector<std::string> checkpoint_modules;
  /// With checkpointing on, for a compiled model: the activation memory
  /// budget of the compiler's selective checkpointing
  /// (`torch._functorch.config.activation_memory_budget`, above 0 and below
  /// 1), used instead of recomputing whole blocks; 0 where whole blocks
  /// recompute. JSON `activation_memory_budget`, written only when set.
  double activation_memory_budget = 0;
  /// Memory format of a convolutional model's weights and image inputs:
  /// "channels_last" (NHWC, which tensor cores and oneDNN prefer) or
  /// "contiguous" (NCHW). JSON `memory_format`, written only when
  /// "channels_last" (from Python's `tune(memory_format=...)`).
  std::string memory_format = "contiguous";
  /// Forward-only batch for evaluation (no gradients, no optimizer step):
  /// found by a forward-only search; 0 when none was (evaluation then runs
  /// at the micro-batch). JSON `eval_micro_batch_size`.
  int64_t eval_micro_batch_size = 0;
  /// One plain sentence per choice, saying why and where it came from.
  std::vector<PlanReason> reasons;
  /// What the plan could not know and guessed (the batch the base lr
  /// belongs to): printed as warnings, JSON `warnings`.
  std::vector<std::string> warnings;
  /// What the plan was made for (JSON `workload`).
  PlanWorkload workload;

  /// The reason for `field`, replacing the one there was (or added).
  void set_reason(PlanField field, std::string text);
  /// The reason for `field`; empty when there is none.
  std::string reason(PlanField field) const;
};

/// What a plan is made from.
///
/// Example:
/// ```
///   auto plan = batchtune::make_plan(batchtune::PlanOptions()
///                                        .micro_batch_size(64)
///                                        .target_batch(512)
///                                        .optimizer("sgd")
///                                        .base_lr(0.1)
///                                        .base_batch(256));
///   // accumulation 8, global 512, lr 0.2 (linear), warm-up 20 steps
/// ```
struct PlanOptions {
  /// The micro-batch: from a tune, or `--batch-size`. Required (≥ 1).
  TORCH_ARG(int64_t, micro_batch_size) = 0;
  /// Global batch to reach (micro × accumulation × world size); 0 for none
  /// (global = micro × world size). Reached exactly by the largest
  /// micro-batch up to the chosen one that divides it, as long as the
  /// measured `speeds` put it within `speed_tolerance` of the chosen one's
  /// speed (without speeds: down to `kUnmeasuredMicroBatchShare` of it);
  /// else the nearest reachable one, the reason saying how far off.
  TORCH_ARG(int64_t, target_batch) = 0;
  /// Sweep rows: the speed of smaller micro-batches (see `target_batch`).
  TORCH_ARG(std::vector<MeasuredSpeed>, speeds) = {};
  /// How much slower than the chosen micro-batch a smaller one may be.
  TORCH_ARG(double, speed_tolerance) = 0.02;
  /// The micro-batch is rounded down to a multiple of this (8 for tensor
  /// cores); 1 for none.
  TORCH_ARG(int64_t, multiple_of) = 1;
  TORCH_ARG(int64_t, world_size) = 1;
  /// The learning rate known to work at `base_batch`.
  TORCH_ARG(double, base_lr) = 1e-3;
  /// The batch `base_lr` belongs to; 0 when unknown: the lr is then taken
  /// as the one for the global batch (not scaled), and the plan warns.
  TORCH_ARG(int64_t, base_batch) = 0;
  /// Picks the default `lr_scaling`.
  TORCH_ARG(std::string, optimizer) = "adam";
  /// `linear`, `sqrt`, `none`, or empty for the optimizer's default.
  TORCH_ARG(std::string, lr_scaling) = "";
  /// Warm-up steps; negative for the rule (`kWarmupStepsPerLrDoubling`).
  TORCH_ARG(int64_t, warmup_steps) = -1;
  /// Resolved mixed precision (see `choose_amp`) and why it was chosen.
  TORCH_ARG(AmpMode, amp) = AmpMode::kOff;
  TORCH_ARG(std::string, amp_reason) = "";
  TORCH_ARG(int64_t, workers) = kDefaultWorkers;
  TORCH_ARG(bool, pin_memory) = false;
  TORCH_ARG(int64_t, prefetch) = kDefaultPrefetch;
  /// Who reads the reasons and errors: each names the options as this
  /// front end does (`--target-batch` on the command line, `target_batch`
  /// from Python).
  TORCH_ARG(FrontEnd, front_end) = FrontEnd::kCli;
  /// Where the values not given as their option came from, for the reasons
  /// (`target_batch`, `base_lr`, `lr_scaling`, `warmup_steps`...): a plan
  /// file ("the plan p.json"), the optimizer ("the optimizer's lr"); an
  /// option without an entry is named by `front_end`.
  TORCH_ARG(OptionSources, sources) = {};
};

/// Makes a plan, with a reason for each choice. Throws
/// `batchtune::OptionError` naming the option for a value out of range.
Plan make_plan(const PlanOptions& options);

/// The scaled learning rate: `base_lr × f(global_batch / base_batch)`.
double scale_lr(double base_lr, int64_t base_batch, int64_t global_batch, LrScaling scaling);

/// Warm-up steps of the rule for a learning rate raised by `lr_factor`.
int64_t warmup_rule(double lr_factor);

/// The learning-rate schedule: linear warm-up from `lr / warmup_steps` to
/// `lr` over the first `warmup_steps` optimizer steps, then constant.
/// `step` counts optimizer steps from 0.
///
/// Example:
/// ```
///   scheduled_lr(0.4, 4, 0);   // 0.1
///   scheduled_lr(0.4, 4, 3);   // 0.4
///   scheduled_lr(0.4, 4, 99);  // 0.4
/// ```
double scheduled_lr(double lr, int64_t warmup_steps, int64_t step);

/// The plan as JSON, with exactly the fields of `Plan` (and `reasons`;
/// `token_budget` and `length_buckets` only when the plan has a budget).
nlohmann::json to_json(const Plan& plan);
/// Reads a plan from JSON: a plan object, or an object with a `plan` field
/// (as `batchtune tune --json` writes). Every field is checked; a bad one
/// throws `batchtune::Error` as "`source`: field `name`: what is wrong".
Plan plan_from_json(const nlohmann::json& json, const std::string& source);
/// `plan_from_json` over JSON text; text that is not JSON throws
/// `batchtune::Error` naming `source`.
Plan parse_plan_json(const std::string& text, const std::string& source);
/// Reads a plan file; errors name the file and the field.
Plan read_plan_file(const std::string& path);

nlohmann::json to_json(const PlanWorkload& workload);

/// A run's usable memory may be this much below the plan's before the plan
/// is refused: the plan's margin covers it.
constexpr double kPlanMemoryTolerance = 0.05;

/// Refuses (`batchtune::Error` naming `source` and the field) a plan made for
/// another workload than `current`: model, input, optimizer, device or
/// memory limit, the fix naming options as `front_end` does. Fields either
/// side did not record are not compared.
void check_plan_workload(const PlanWorkload& planned, const PlanWorkload& current,
                         const std::string& source, FrontEnd front_end);

}  // namespace batchtune
