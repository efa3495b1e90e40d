// The step source of a run on images (step_source.h), private to the
// training layer: each logical batch's samples in a seeded order, this
// rank's shard of them, read ahead by the loader, trained in micro-batches
// of the plan.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/data/batch.h"
#include "batchtune/data/dataset.h"
#include "batchtune/data/loader.h"
#include "batchtune/data/sample_cursor.h"
#include "batchtune/distributed/data_parallel.h"
#include "batchtune/plan/plan.h"
#include "batchtune/training/step_source.h"
#include "batchtune/training/trainer.h"

namespace batchtune {

class DeviceMemory;
class Workload;

class SampleSteps final : public StepSource {
 public:
  /// `plan` is the run's as it stands (an out-of-memory halves its
  /// micro-batch, `--adapt` changes its batch): the source changes it, the
  /// trainer reads it. Throws `OptionError` for a batch larger than the data,
  /// samples the model does not take, or an `--adapt` limit past the data.
  SampleSteps(const Dataset& train, const Workload& workload, Plan& plan,
              const TrainOptions& options, DataParallel& data_parallel, DeviceMemory& memory);

  std::optional<int64_t> steps_in(int64_t epochs) const override {
    return cursor_.first_step_of(epochs);
  }
  bool epochs_done(int64_t step, int64_t epochs) const override {
    return step >= cursor_.first_step_of(epochs);
  }
  int64_t epoch_at(int64_t step) const override { return cursor_.at(step).epoch; }
  double epochs_at(int64_t step) const override;
  std::string position_in_epoch(int64_t step) const override;

  void start(int64_t step, const Clock& clock) override;
  void next(int64_t step, bool split_for_noise, double& data_seconds) override;
  int64_t local_samples() const override { return batch_->size(); }
  int64_t samples() const override { return plan_.global_batch_size; }
  at::Tensor backward(TrainingStep& step, int64_t step_index, double& data_seconds) override;
  std::string shrink(const std::string& why, int64_t step_index, TrainingStep& step) override;
  int64_t progress() const override { return run_samples_; }

  int64_t global_batch() const override { return plan_.global_batch_size; }
  BatchChange start_change() const override;
  std::optional<int64_t> micro_cap() const override { return cap_; }
  std::string resize(BatchChange& change, TrainingStep& step) override;

  void identify(RunIdentity& id) const override;
  void save(CheckpointRecord& record) const override;
  /// Nothing beyond the run's identity.
  void check(const CheckpointRecord& /*record*/, const std::string& /*path*/) const override {}
  void load(const CheckpointRecord& record, const std::vector<BatchChange>& schedule,
            const std::string& path) override;
  void describe(TrainEvent& event, double train_seconds) const override;
  void summarize(TrainSummary& summary, double seconds) const override;

  AdaptOptions adapt_options() const override;
  /// Optimizer steps in one epoch at the plan's global batch.
  int64_t steps_per_epoch() const { return train_.size() / plan_.global_batch_size; }

 private:
  const Dataset& train_;
  Plan& plan_;
  const Plan start_plan_;
  const TrainOptions& options_;
  DataParallel& data_parallel_;
  DeviceMemory& memory_;
  const Clock* clock_ = nullptr;
  /// Which samples each step takes, through the global batch's changes.
  SampleCursor cursor_;
  /// Epoch `order_epoch_`'s visiting order (drawn from the seed and the epoch).
  std::vector<int64_t> order_;
  int64_t order_epoch_ = -1;
  std::optional<Loader> loader_;
  std::optional<Batch> batch_;
  int64_t run_samples_ = 0;
  /// The micro-batch an out-of-memory left, which `--adapt` keeps below.
  std::optional<int64_t> cap_;
};

}  // namespace batchtune
