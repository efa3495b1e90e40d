#pragma once

#include <pybind11/pybind11.h>

namespace batchtune::python {

/// Binds `TrialSubject` (a trampoline: Python supplies prepare, step, save
/// and restore) and the C++ `TrialRunner` over it.
void bind_trial_subject(pybind11::module_& m);

/// What a tune's result names a KeyboardInterrupt by (`interrupted_by`).
inline constexpr const char* kKeyboardInterrupt = "KeyboardInterrupt";

/// A KeyboardInterrupt raised in the Python subject (or a reporter) is noted
/// here and becomes `batchtune::Interrupted`, which the runner passes on
/// after restoring the subject: `tune` ends with what was measured, a lone
/// trial (`probe`) raises KeyboardInterrupt again.
void note_keyboard_interrupt();
bool keyboard_interrupt_noted();
void clear_keyboard_interrupt();

}  // namespace batchtune::python
