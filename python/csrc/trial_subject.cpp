#include "trial_subject.h"

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <c10/util/Exception.h>

#include <atomic>
#include <string>

#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/step/amp.h"
#include "batchtune/step/lockstep.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/trial.h"
#include "batchtune/step/trial_failure.h"

namespace py = pybind11;

namespace batchtune::python {
namespace {

std::atomic<bool> keyboard_interrupt{false};

std::string first_line_of(const py::error_already_set& e) {
  return first_line(py::str(e.value()).cast<std::string>());
}

/// A `TrialSubject` whose methods are Python's. An out-of-memory raised in
/// Python (torch.OutOfMemoryError) becomes the `c10::OutOfMemoryError` the
/// C++ runner turns into a result, and a Python error whose message is a size
/// refusal (batch norm at batch 1) a `c10::Error`; the Python exception (and
/// the frames, and the tensors they hold) is released first. A
/// KeyboardInterrupt becomes `batchtune::Interrupted` (noted, see
/// `note_keyboard_interrupt`). Anything else passes through unchanged and
/// the runner decides as for a C++ error: an out-of-memory under another
/// name ("CUDA error: out of memory" as a RuntimeError or
/// torch.AcceleratorError, cuDNN's failed engine search after the allocator
/// refused its workspace) by the allocator's counter or the message becomes
/// a result; the user's own exception is rethrown after the state is
/// restored, and Python sees it.
class PyTrialSubject : public TrialSubject {
 public:
  using TrialSubject::TrialSubject;

  std::string describe() const override {
    PYBIND11_OVERRIDE_PURE(std::string, TrialSubject, describe);
  }
  void prepare(int64_t batch_size) override { translated([&] { call("prepare", batch_size); }); }
  at::Tensor step() override {
    at::Tensor loss;
    translated([&] { loss = call("step").cast<at::Tensor>(); });
    return loss;
  }
  AmpMode amp() const override {
    py::gil_scoped_acquire gil;
    py::object self = py::cast(static_cast<const TrialSubject*>(this));
    if (!py::hasattr(self, "amp")) return AmpMode::kOff;
    return parse_amp(self.attr("amp").cast<std::string>());
  }
  void set_sequence_length(int64_t length) override {
    translated([&] {
      py::gil_scoped_acquire gil;
      py::function method =
          py::get_override(static_cast<const TrialSubject*>(this), "set_sequence_length");
      if (method) {
        method(length);
      } else {
        TrialSubject::set_sequence_length(length);
      }
    });
  }
  int64_t sequence_length() const override {
    py::gil_scoped_acquire gil;
    py::function method =
        py::get_override(static_cast<const TrialSubject*>(this), "sequence_length");
    return method ? method().cast<int64_t>() : 0;
  }
  void save() override { translated([&] { call("save"); }); }
  bool set_forward_only(bool on) override {
    bool supported = !on;  // a subject of the user's own without a forward-only step
    translated([&] {
      py::gil_scoped_acquire gil;
      py::function method =
          py::get_override(static_cast<const TrialSubject*>(this), "set_forward_only");
      if (method) supported = method(on).cast<bool>();
    });
    return supported;
  }
  void restore() override { translated([&] { call("restore"); }); }
  bool communicates() const override {
    py::gil_scoped_acquire gil;
    py::function method =
        py::get_override(static_cast<const TrialSubject*>(this), "communicates");
    return method ? method().cast<bool>() : false;
  }
  void set_lockstep(Lockstep* lockstep) override {
    py::gil_scoped_acquire gil;
    py::function method =
        py::get_override(static_cast<const TrialSubject*>(this), "set_lockstep");
    if (method) method(py::cast(lockstep, py::return_value_policy::reference));
  }
  bool last_step_skipped() const override {
    py::gil_scoped_acquire gil;
    py::function method =
        py::get_override(static_cast<const TrialSubject*>(this), "last_step_skipped");
    return method ? method().cast<bool>() : false;
  }

 private:
  py::object call(const char* name, py::args args = py::args()) const {
    py::gil_scoped_acquire gil;
    py::function method = py::get_override(static_cast<const TrialSubject*>(this), name);
    if (!method) {
      throw Error(std::string("TrialSubject: the Python subject has no method ") + name);
    }
    return method(*args);
  }
  py::object call(const char* name, int64_t value) const {
    py::gil_scoped_acquire gil;
    py::function method = py::get_override(static_cast<const TrialSubject*>(this), name);
    if (!method) {
      throw Error(std::string("TrialSubject: the Python subject has no method ") + name);
    }
    return method(value);
  }

  template <typename F>
  static void translated(F&& body) {
    std::string message;
    bool oom = false;
    bool refusal = false;
    bool interrupted = false;
    {
      try {
        body();
        return;
      } catch (py::error_already_set& e) {
        py::gil_scoped_acquire gil;
        static py::handle oom_type =
            py::object(py::module_::import("torch").attr("OutOfMemoryError")).release();
        if (e.matches(PyExc_KeyboardInterrupt)) {
          interrupted = true;
        } else if (e.matches(oom_type)) {
          oom = true;
          message = first_line_of(e);
        } else if ((e.matches(PyExc_RuntimeError) || e.matches(PyExc_ValueError)) &&
                   is_size_refusal(py::str(e.value()).cast<std::string>())) {
          refusal = true;
          message = first_line_of(e);
        } else {
          throw;
        }
      }
    }
    // The Python exception is gone here: its frames no longer hold tensors.
    if (interrupted) {
      note_keyboard_interrupt();
      throw Interrupted();
    }
    if (oom) TORCH_CHECK_WITH(OutOfMemoryError, false, message);
    if (refusal) TORCH_CHECK(false, message);
  }
};

}  // namespace

void note_keyboard_interrupt() { keyboard_interrupt = true; }
bool keyboard_interrupt_noted() { return keyboard_interrupt; }
void clear_keyboard_interrupt() { keyboard_interrupt = false; }

void bind_trial_subject(py::module_& m) {
  m.attr("HAS_TRIAL_SUBJECT") = true;
  py::class_<TrialSubject, PyTrialSubject>(
      m, "TrialSubject",
      "What a trial trains, from Python: describe(), prepare(batch_size) (untimed: make the "
      "batch), step() (one training step, returns the 0-dim loss), save() and restore().")
      .def(py::init<>())
      .def("describe", &TrialSubject::describe);
  py::class_<Lockstep>(m, "Lockstep",
                       "The trials' lockstep with the other ranks (the tune owns it): a step "
                       "that communicates calls check_peers() before its collectives.")
      .def("check_peers", &Lockstep::check_peers,
           "Meets the other ranks: False when one ran out of memory in this step (stop it "
           "as an out-of-memory); raises when one stopped with an error.")
      .def("failure_agreed", &Lockstep::failure_agreed,
           "Whether this trial's failure is already known to every rank (meet no more).")
      .def("begin_trial", &Lockstep::begin_trial, py::arg("batch_size"),
           "A new step (or trial) at batch_size: no failure agreed yet.")
      .def("fail", &Lockstep::fail, py::arg("error") = false,
           "This rank failed: tells the others at their next meeting (once).");
  py::class_<TrialRunner>(m, "TrialRunner",
                          "The C++ trial runner over a Python subject: it times the steps, "
                          "turns an out-of-memory into a result and restores the subject.")
      .def(py::init<TrialSubject&, DeviceMemory&, double>(), py::arg("subject"),
           py::arg("memory"), py::arg("margin") = kDefaultMargin, py::keep_alive<1, 2>(),
           py::keep_alive<1, 3>())
      .def("run", &TrialRunner::run)
      .def_property_readonly("margin", &TrialRunner::margin)
      .def_property_readonly("total_steps", &TrialRunner::total_steps);
}

}  // namespace batchtune::python
