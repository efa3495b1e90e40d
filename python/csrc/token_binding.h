#pragma once

#include <pybind11/pybind11.h>

namespace batchtune::python {

/// Binds what `batchtune.TokenBudgetSampler` batches with: the library's
/// `LengthBucketSampler` (the micro-batches of `train --data text:DIR`),
/// `steps_by_tokens` and `mean_length`, so that Python cuts an epoch by the
/// same rules as the CLI.
void bind_tokens(pybind11::module_& m);

}  // namespace batchtune::python
