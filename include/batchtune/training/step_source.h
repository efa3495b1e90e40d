#pragma once

// What a training run trains on, step by step: the side of the one training
// loop (`Trainer`) that differs between images and text.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/training/batch_adapter.h"

namespace batchtune {

class Clock;
struct CheckpointRecord;
struct RunIdentity;
struct TrainEvent;
struct TrainSummary;
class TrainingStep;

/// The batches of a run's optimizer steps, in the order its seed gives, and
/// what changes their size. Images (`SampleSteps`, src/training/sample_steps.h):
/// each logical batch's samples, this rank's shard of them, read ahead by the
/// loader, in micro-batches of the plan. Text (`TokenSteps`, token_steps.h):
/// each epoch's micro-batches filled to a token budget, grouped into steps by
/// their real tokens. The loop keeps the rest: the optimizer step and its lr,
/// the retry after an out-of-memory, `--adapt`'s decisions, evaluation, the
/// targets, logs, checkpoints and the time limit.
class StepSource {
 public:
  virtual ~StepSource() = default;

  // The run's length.
  /// Optimizer steps `epochs` epochs take, at the batch and its changes so
  /// far; nullopt where only the end tells (text: steps group tokens).
  virtual std::optional<int64_t> steps_in(int64_t epochs) const = 0;
  /// True when `epochs` epochs are done after `step` optimizer steps.
  virtual bool epochs_done(int64_t step, int64_t epochs) const = 0;
  /// The epoch (from 0) of the step after `step` steps; where `steps_in`
  /// cannot tell (text), of the step after those trained so far, whatever
  /// `step`.
  virtual int64_t epoch_at(int64_t step) const = 0;
  /// Epochs done after `step` steps, with the share of the one under way.
  virtual double epochs_at(int64_t step) const = 0;
  /// Where in its epoch the step after `step` steps is, as a resume says
  /// it ("batch 3 of it").
  virtual std::string position_in_epoch(int64_t step) const = 0;

  // Each step.
  /// Reads from step `step` on: the run's start (or its resume's), or the
  /// step after a change of the batch.
  virtual void start(int64_t step, const Clock& clock) = 0;
  /// Fetches step `step`'s data, adding a wait for it to `data_seconds`.
  /// `split_for_noise`: the loop measures the noise scale in this step, and
  /// a step of one micro-batch should come as two (text; the image step
  /// splits its batch itself).
  virtual void next(int64_t step, bool split_for_noise, double& data_seconds) = 0;
  /// This rank's samples in the step fetched.
  virtual int64_t local_samples() const = 0;
  /// All ranks' samples in the step fetched.
  virtual int64_t samples() const = 0;
  /// Forward and backward passes over the step fetched, in micro-batches as
  /// they stand: the step's loss (see `TrainingStep::backward`).
  virtual at::Tensor backward(TrainingStep& step, int64_t step_index, double& data_seconds) = 0;
  /// After an out-of-memory (`why`) in step `step_index`: the step fetched,
  /// and those after it, in smaller micro-batches; the line that says so.
  /// Throws `Error` when nothing smaller is left.
  virtual std::string shrink(const std::string& why, int64_t step_index, TrainingStep& step) = 0;
  /// Training units so far in this run (samples; text: real tokens), which
  /// `--adapt` times its windows by.
  virtual int64_t progress() const = 0;

  // --adapt.
  /// `--adapt`'s options: the run's, in the source's unit, the largest
  /// global batch within the data by default. Throws `OptionError` for a
  /// limit past the data.
  virtual AdaptOptions adapt_options() const = 0;
  /// The global batch in the adapter's unit (samples; text: real tokens a step).
  virtual int64_t global_batch() const = 0;
  /// The run's start as a schedule entry: the global batch, its split and why.
  virtual BatchChange start_change() const = 0;
  /// The most a micro-batch may hold now, when the adapter must keep below
  /// it (text: the budget; images: after an out-of-memory).
  virtual std::optional<int64_t> micro_cap() const = 0;
  /// Trains at `change` from its step on: fills in its split, returns the
  /// line that says so.
  virtual std::string resize(BatchChange& change, TrainingStep& step) = 0;

  // Checkpoints and reports.
  /// What makes this run another's: the batch, the data's size, the ranks.
  virtual void identify(RunIdentity& id) const = 0;
  virtual void save(CheckpointRecord& record) const = 0;
  /// Throws `OptionError` for a checkpoint (read from `path`) this run cannot
  /// continue beyond what its identity tells; before anything is loaded.
  virtual void check(const CheckpointRecord& record, const std::string& path) const = 0;
  /// Continues from `record` (read from `path`); `schedule`: `--adapt`'s
  /// changes it replayed, the first the start (empty without `--adapt`).
  virtual void load(const CheckpointRecord& record, const std::vector<BatchChange>& schedule,
                    const std::string& path) = 0;
  /// The source's fields of a log event (the step's split, a message).
  virtual void describe(TrainEvent& event, double train_seconds) const = 0;
  /// The source's fields of the summary (`seconds`: this run's training time).
  virtual void summarize(TrainSummary& summary, double seconds) const = 0;
};

}  // namespace batchtune
