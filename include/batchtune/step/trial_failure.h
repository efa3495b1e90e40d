#pragma once

#include <cstdint>
#include <string>

namespace c10 {
class Error;
}

namespace batchtune {

/// What a LibTorch error thrown by a training step says about the batch size.
enum class StepFailure {
  /// The device ran out of memory: a smaller batch may fit.
  kOutOfMemory,
  /// LibTorch refused the size itself (batch norm at batch 1, a CUDA launch
  /// configuration too large): it bounds the search like an out-of-memory.
  kSizeRefusal,
  /// Anything else (a shape mismatch, a bug): not a size limit.
  kError,
};

/// What is known about one failed step.
struct StepFailureEvidence {
  /// The error was a `c10::OutOfMemoryError` (the caching allocator's own, or
  /// the CPU budget's).
  bool out_of_memory_error = false;
  /// Its message, without the backtrace.
  std::string message;
  /// The device memory's out-of-memory counter (`DeviceMemory::oom_count`)
  /// before the step and after the failure.
  int64_t ooms_before = 0;
  int64_t ooms_after = 0;
};

/// Classifies a failed step, in this order:
/// 1. a `c10::OutOfMemoryError` is memory;
/// 2. the allocator's out-of-memory counter rose during the step: memory,
///    whatever the message — cuDNN's engine search catches the workspace
///    allocation failure and ends with "unable to find an engine to execute
///    this computation", and other libraries wrap it in their own errors;
/// 3. a message that names an allocation failure outside the caching
///    allocator ("CUDA error: out of memory", `CUBLAS_STATUS_ALLOC_FAILED`):
///    memory, although no counter saw it;
/// 4. a message in the size-refusal table (`is_size_refusal`): a size refusal;
/// 5. anything else is an error.
///
/// Example:
/// ```
///   const int64_t before = memory.oom_count();
///   try { step(); } catch (const c10::Error& e) {
///     if (classify_step_failure(e, before, memory.oom_count()) == StepFailure::kError) throw;
///   }
/// ```
StepFailure classify_step_failure(const StepFailureEvidence& evidence);

/// The same for a caught LibTorch error.
StepFailure classify_step_failure(const c10::Error& error, int64_t ooms_before,
                                  int64_t ooms_after);

/// Whether a message names a failed device allocation made outside the
/// caching allocator (so that its out-of-memory counter did not move).
bool is_memory_message(const std::string& message);

/// Whether a LibTorch error message says the batch size itself cannot run
/// (see `TrialFailure::kDoesNotRun`), rather than that something is wrong.
bool is_size_refusal(const std::string& message);

}  // namespace batchtune
