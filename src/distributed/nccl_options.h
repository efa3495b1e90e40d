#pragma once

// How batchtune asks ProcessGroupNCCL to fail: blocking wait, so that a
// collective whose peer is gone throws from `wait()` after --timeout (and
// the dead-rank diagnosis runs), instead of `wait()` returning at once and
// the watchdog tearing the process down later (NCCL's default,
// TORCH_NCCL_ASYNC_ERROR_HANDLING=3). ProcessGroupNCCL reads these variables
// when it is made; its Options have no field for them.

#include <string>

namespace batchtune {

/// Sets TORCH_NCCL_BLOCKING_WAIT=1 unless the user set it (or its old name
/// NCCL_BLOCKING_WAIT). Returns whether blocking wait is on; `note` gets a
/// line for people when the user turned it off.
bool prefer_nccl_blocking_wait(std::string* note);

}  // namespace batchtune
