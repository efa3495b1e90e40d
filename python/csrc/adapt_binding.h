#pragma once

#include <pybind11/pybind11.h>

namespace batchtune::python {

/// Binds what `batchtune.Trainer(adapt=True)` decides with: the library's
/// `BatchAdapter` (the policy of `train --adapt`), `NoiseScaleEstimator` and
/// `SampleCursor`, so that Python follows the same rules as the CLI.
void bind_adapt(pybind11::module_& m);

}  // namespace batchtune::python
