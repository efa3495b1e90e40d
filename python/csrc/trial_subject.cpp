#include "trial_subject.h"

namespace batchtune::python {

void bind_trial_subject(pybind11::module_& m) { m.attr("HAS_TRIAL_SUBJECT") = false; }

}  // namespace batchtune::python
