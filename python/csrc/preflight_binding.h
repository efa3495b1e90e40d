#pragma once

#include <pybind11/pybind11.h>

namespace batchtune::python {

/// Binds what `batchtune.estimate` replays its trace through: the model of
/// the CUDA caching allocator (`replay_trace`) and the GPU profiles
/// (`gpu_profile`, `gpu_profile_names`), so that Python's estimate uses the
/// core's rules and constants, never a copy of them.
void bind_preflight(pybind11::module_& m);

}  // namespace batchtune::python
