// The trainer's evaluation on the test split (each rank its share), and the
// target accuracy it can end the run at.
#include "batchtune/training/trainer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include "batchtune/common/error.h"
#include "batchtune/data/loader.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/amp.h"
#include "batchtune/step/trial_failure.h"
#include "batchtune/step/workload.h"

namespace batchtune {

double Trainer::evaluate() {
  if (test_ == nullptr) return 0;
  // Buffers (batch-norm statistics) follow rank 0's, as PyTorch's DDP does.
  data_parallel_.broadcast_from_first(workload_.model().buffers());
  at::NoGradGuard no_grad;
  workload_.model().train(false);
  const c10::Device device = memory_.device();
  int64_t batch = options_.eval_batch_size() > 0 ? options_.eval_batch_size()
                                                 : plan_.micro_batch_size;
  int64_t correct = 0;
  // Data parallel: each rank evaluates its share of the test split.
  const auto [first, last] =
      shard_range(test_->size(), data_parallel_.rank(), data_parallel_.world_size());
  int64_t begin = first;
  while (begin < last) {
    const int64_t end = std::min(last, begin + batch);
    std::vector<int64_t> indices(static_cast<size_t>(end - begin));
    for (int64_t i = begin; i < end; ++i) indices[static_cast<size_t>(i - begin)] = i;
    const int64_t ooms_before = memory_.oom_count();
    try {
      const Batch b = to_device(test_->get_batch(indices), device, false);
      at::Tensor logits;
      {
        AutocastGuard autocast(device.type(), plan_.amp);
        logits = workload_.model().forward(b.inputs[0]);
      }
      correct += logits.argmax(1).eq(b.target).sum().item<int64_t>();
      begin = end;
    } catch (const c10::Error& e) {
      if (classify_step_failure(e, ooms_before, memory_.oom_count()) != StepFailure::kOutOfMemory) {
        throw;
      }
      memory_.release_cached();
      if (batch == 1) {
        workload_.model().train(true);
        throw Error("train: out of memory evaluating the test set at batch 1: " +
                    first_line(e.what_without_backtrace()));
      }
      batch = (batch + 1) / 2;
    }
  }
  workload_.model().train(true);
  correct = data_parallel_.sum(correct);
  return static_cast<double>(correct) / static_cast<double>(test_->size());
}

bool Trainer::evaluate_now(TrainEvent::Kind kind) {
  if (test_ == nullptr) return false;
  if (test_accuracy_step_ != step_) {
    test_accuracy_ = evaluate();
    test_accuracy_step_ = step_;
  }
  emit(kind);
  const auto& target = options_.target_accuracy();
  if (!target || reached_ || *test_accuracy_ < *target) return false;
  reached_ = Reached{step_, train_seconds_, samples_};
  emit(TrainEvent::Kind::kTargetReached,
       fmt::format("test accuracy {:.2f} % reached the target {:.2f} % at step {} after {:.1f} s "
                   "of training: stopping",
                   *test_accuracy_ * 100, *target * 100, step_, train_seconds_));
  return true;
}

}  // namespace batchtune
