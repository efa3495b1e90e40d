#pragma once

#include <pybind11/pybind11.h>

namespace batchtune::python {

/// Binds `TrialSubject` (a trampoline: Python supplies prepare, step, save
/// and restore) and the C++ `TrialRunner` over it.
void bind_trial_subject(pybind11::module_& m);

}  // namespace batchtune::python
