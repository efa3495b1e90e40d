#include "batchtune/quick_tune.h"

#include "batchtune/error.h"

namespace batchtune {

Plan quick_tune(Workload& /*workload*/, DeviceMemory& /*memory*/,
                const PlanOptions& /*options*/) {
  throw Error("train: --batch-size or --plan is required until tune lands");
}

}  // namespace batchtune
