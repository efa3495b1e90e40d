#pragma once

#include <pybind11/pybind11.h>

namespace batchtune::python {

/// Binds `TuneOptions`, a subclassable `TuneReporter`, a subclassable
/// `Communicator` and `tune` (the library's pipeline over a `TrialRunner`).
void bind_tune(pybind11::module_& m);

}  // namespace batchtune::python
