#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/common/crc32.h"
#include "batchtune/plan/plan.h"
#include "batchtune/step/loss_scaler.h"
#include "batchtune/step/successive_gradients.h"
#include "batchtune/training/checkpoint_lock.h"
#include "batchtune/training/model_exports.h"
#include "batchtune/training/trainer.h"

namespace batchtune {

class Model;

/// What a run is: a checkpoint records it, and a resume must match it field
/// by field (`check_same_run`), so that another optimizer, precision, input
/// or batch is refused by name instead of resuming into nonsense.
struct RunIdentity {
  std::string model;      ///< `Model::describe()`: name and parameter count
  std::string input;      ///< `describe(InputSpec)`
  std::string optimizer;  ///< `adam`, `adamw`, `sgd`
  std::string amp;        ///< `amp_name(plan.amp)`
  int64_t world_size = 1;
  int64_t global_batch_size = 0;
  int64_t train_size = 0;  ///< training samples
  uint64_t seed = 0;       ///< shuffling seed
  double lr = 0;           ///< peak learning rate of the plan
  int64_t warmup_steps = 0;
};

/// Where a run stands after an optimizer step.
struct CheckpointPosition {
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t batch_in_epoch = 0;
  int64_t samples = 0;
  int64_t oom_recoveries = 0;
};

/// Everything a checkpoint records besides the tensors.
struct CheckpointRecord {
  RunIdentity identity;
  CheckpointPosition position;
  /// The plan as it stood (an out-of-memory may have shrunk its micro-batch).
  Plan plan;
  /// The summary of the run, when it finished (all its steps done): a resume
  /// of a finished run re-emits it instead of training nothing.
  std::optional<TrainSummary> summary;
  /// `--adapt`: the batch schedule so far, the policy's state (speeds
  /// measured) and the noise estimate, so that a resume continues the same
  /// schedule; nullopt without `--adapt`. JSON `adapt`.
  std::optional<nlohmann::json> adapt;
  /// `--adapt` without accumulation: the gradient kept to measure the noise
  /// scale against the next step's (host tensors when read). Tensors
  /// `noise/previous/I`, `noise/previous_sq_norm`, `noise/previous_scale`.
  std::optional<SuccessiveGradients::State> successive;
  /// Text trained by a token budget (`train_by_tokens`): the rest of the
  /// epoch's micro-batches, the tokens per step and the budget as they
  /// stand, and the token counts so far; nullopt for other runs. JSON `tokens`.
  std::optional<nlohmann::json> tokens;
  /// `--target-loss`: the last steps' losses its moving mean is over
  /// (`LossTarget::window`), so that a resume stops where the whole run
  /// would have; empty without a target. JSON `loss_window`.
  std::vector<double> loss_window;
};

/// What a checkpoint writes and reads: the model, its optimizer and loss scaler.
struct CheckpointTarget {
  Model& model;
  torch::optim::Optimizer& optimizer;
  LossScaler& scaler;
};

/// Writes `dir/checkpoint.pt` (atomically; `dir` is made if missing): the
/// model's parameters and buffers by name, the optimizer's state, the loss
/// scaler, the default CPU generator and `record`, each tensor with a CRC-32
/// of its bytes. First writes `dir/model.pt`, the trained weights as a
/// `{name: tensor}` dict in the format of `torch.save`, and for a TorchScript
/// model `dir/model.torchscript.pt`; removes temporary files that a killed
/// run left there. Throws `batchtune::Error` naming the file.
///
/// Example:
/// ```
///   batchtune::write_checkpoint("ckpt", {model, optimizer, scaler}, record);
/// ```
void write_checkpoint(const std::string& dir, const CheckpointTarget& target,
                      const CheckpointRecord& record);

/// Reads `dir/checkpoint.pt` into `target` when there is one (nullopt when
/// not): refuses a file whose bytes do not match their checksums, one that is
/// not a batchtune checkpoint, and one written by a run that differs from
/// `expected` (naming the field and the flag), with a `batchtune::Error`
/// that names the file. Nothing of `target` changes unless all checks pass.
std::optional<CheckpointRecord> read_checkpoint(const std::string& dir,
                                                const RunIdentity& expected,
                                                const CheckpointTarget& target);

/// The identity recorded in `dir/checkpoint.pt` (nullopt when there is
/// none), checked as `read_checkpoint` checks the file: a resume trains at
/// the precision the run was written with, never a new measurement.
std::optional<RunIdentity> read_checkpoint_identity(const std::string& dir);

/// The plan recorded in `dir/checkpoint.pt` (nullopt when there is none),
/// checked as `read_checkpoint_identity` checks the file: a text run resumes
/// with the plan it was written with, never a new quick tune.
std::optional<Plan> read_checkpoint_plan(const std::string& dir);

/// Throws `batchtune::Error` naming the first field where `saved` (read from
/// `path`) and `expected` differ, and the flag that sets it.
void check_same_run(const RunIdentity& saved, const RunIdentity& expected,
                    const std::string& path);

/// Removes `dir`'s temporary files of checkpoint writes (`checkpoint.pt.tmp.PID`,
/// `model.pt.tmp.PID`...) whose writer is no longer running. Returns how many.
int remove_stale_checkpoint_files(const std::string& dir);

}  // namespace batchtune
