#pragma once

#include "batchtune/plan.h"

namespace batchtune {

class DeviceMemory;
class Workload;

/// The short search `batchtune train` runs when given neither
/// `--batch-size` nor `--plan`: finds the micro-batch for `workload` on
/// `memory` and returns `make_plan(options)` with it filled in (the other
/// options — target batch, lr, amp — as the caller set them).
///
/// Not wired yet: until the tune search lands it throws `batchtune::Error`
/// asking for `--batch-size` or `--plan`.
///
/// Example:
/// ```
///   batchtune::Plan plan = batchtune::quick_tune(workload, *memory,
///                                                batchtune::PlanOptions().target_batch(512));
/// ```
Plan quick_tune(Workload& workload, DeviceMemory& memory, const PlanOptions& options);

}  // namespace batchtune
