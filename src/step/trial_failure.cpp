#include "batchtune/step/trial_failure.h"

#include <c10/util/Exception.h>

namespace batchtune {
namespace {

// Allocation failures that do not pass through the caching allocator, so
// that its out-of-memory counter does not rise: memory taken with cudaMalloc
// directly (C10_CUDA_CHECK's message), and the CUDA libraries' own
// allocations (handles, plans, internal buffers).
constexpr const char* kMemoryMessages[] = {
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUFFT_ALLOC_FAILED",
    "CUSOLVER_STATUS_ALLOC_FAILED",
    "CUSPARSE_STATUS_ALLOC_FAILED",
};

// LibTorch errors that depend on the batch size, not on the model: the size
// "does not run" and bounds the search; anything else is a real error.
constexpr const char* kSizeRefusals[] = {
    "Expected more than 1 value per channel when training",  // batch norm at batch 1
    "invalid configuration argument",                        // CUDA grid too large
    "CUDNN_STATUS_NOT_SUPPORTED",
    "CUBLAS_STATUS_NOT_SUPPORTED",
};

template <size_t N>
bool contains_any(const std::string& message, const char* const (&needles)[N]) {
  for (const char* needle : needles) {
    if (message.find(needle) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

bool is_memory_message(const std::string& message) {
  return contains_any(message, kMemoryMessages);
}

bool is_size_refusal(const std::string& message) { return contains_any(message, kSizeRefusals); }

StepFailure classify_step_failure(const StepFailureEvidence& evidence) {
  if (evidence.out_of_memory_error) return StepFailure::kOutOfMemory;
  if (evidence.ooms_after > evidence.ooms_before) return StepFailure::kOutOfMemory;
  if (is_memory_message(evidence.message)) return StepFailure::kOutOfMemory;
  if (is_size_refusal(evidence.message)) return StepFailure::kSizeRefusal;
  return StepFailure::kError;
}

StepFailure classify_step_failure(const c10::Error& error, int64_t ooms_before,
                                  int64_t ooms_after) {
  StepFailureEvidence evidence;
  evidence.out_of_memory_error = dynamic_cast<const c10::OutOfMemoryError*>(&error) != nullptr;
  evidence.message = error.what_without_backtrace();
  evidence.ooms_before = ooms_before;
  evidence.ooms_after = ooms_after;
  return classify_step_failure(evidence);
}

}  // namespace batchtune
