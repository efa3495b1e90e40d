// The one out-of-memory recovery of every training run, private to the
// training layer: the image trainer halves its micro-batch, a token run its
// token budget, and both retry the same step through these two functions.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <string>

namespace batchtune {

class DataParallel;
class DeviceMemory;
class TrainingStep;

/// Runs `attempt` (a step's forward and backward passes) until it fits:
/// after an out-of-memory, under whichever name (see classify_step_failure),
/// frees what the failed try held and calls `shrink` with the error's first
/// line; `shrink` makes the next try smaller, or throws when nothing smaller
/// is left. Any other error is rethrown. Data parallel, the ranks agree
/// after every try (`DataParallel::share_step`): when another rank ran out,
/// this one drops its gradients and shrinks too, so that all retry the same
/// samples at the same size. Returns the step's loss (the ranks' mean).
at::Tensor backward_until_it_fits(DeviceMemory& memory, TrainingStep& step,
                                  DataParallel& ranks,
                                  const std::function<at::Tensor()>& attempt,
                                  const std::function<void(const std::string& why)>& shrink);

/// The optimizer step of step `step` (from 0) at `lr`. An out-of-memory
/// there has no retry: a smaller micro-batch does not shrink the optimizer
/// state, and a step that failed half-way has updated some parameters; it
/// becomes an error that says so.
void apply_or_explain(DeviceMemory& memory, TrainingStep& training_step, double lr,
                      int64_t step);

}  // namespace batchtune
