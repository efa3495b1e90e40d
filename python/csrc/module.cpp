// batchtune._core: the C++ types as they are, for the pure-Python layer in
// python/batchtune/. No policy here: the Python layer owns signatures,
// defaults and messages; this layer holds the measuring and the search.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <c10/util/Exception.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "batchtune/common/atomic_file.h"
#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/common/size.h"
#include "batchtune/memory/budget_allocator.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/monitoring/environment.h"
#include "batchtune/plan/plan.h"
#include "batchtune/reports/json_reporter.h"
#include "batchtune/reports/tune_report.h"
#include "batchtune/step/amp.h"
#include "batchtune/step/trial.h"
#include "batchtune/step/trial_failure.h"
#include "batchtune/tuning/search.h"
#include "batchtune/tuning/sweep.h"
#include "trial_subject.h"
#include "adapt_binding.h"
#include "preflight_binding.h"
#include "token_binding.h"
#include "tune_binding.h"

namespace py = pybind11;

namespace batchtune::python {
namespace {

std::string dump(const nlohmann::json& json) { return json.dump(); }

/// `with _core.uncounted():` — host copies that belong to the tool (a
/// trial's snapshot), outside the emulated budget. Thread-local, as the C++
/// scope it wraps.
class UncountedContext {
 public:
  void enter() { scope_ = std::make_unique<BudgetAllocator::UncountedScope>(); }
  void exit() { scope_.reset(); }

 private:
  std::unique_ptr<BudgetAllocator::UncountedScope> scope_;
};

const char* failure_name(TrialFailure failure) {
  switch (failure) {
    case TrialFailure::kNone: return "none";
    case TrialFailure::kOutOfMemory: return "out_of_memory";
    case TrialFailure::kOverBudget: return "over_budget";
    case TrialFailure::kDoesNotRun: return "does_not_run";
  }
  return "none";
}

void bind_memory(py::module_& m) {
  py::class_<DeviceMemory>(m, "DeviceMemory",
                           "The measured device's memory: the CUDA caching allocator, or the "
                           "CPU's emulated byte budget.")
      .def_property_readonly("device", [](const DeviceMemory& d) { return d.device().str(); })
      .def_property_readonly("capacity_bytes", &DeviceMemory::capacity_bytes)
      .def_property_readonly("usable_bytes", &DeviceMemory::usable_bytes)
      .def("set_usable_bytes", &DeviceMemory::set_usable_bytes)
      .def_property_readonly("live_bytes", &DeviceMemory::live_bytes)
      .def_property_readonly("peak_bytes", &DeviceMemory::peak_bytes)
      .def("reset_peak", &DeviceMemory::reset_peak)
      .def("release_cached", &DeviceMemory::release_cached)
      .def("synchronize", &DeviceMemory::synchronize)
      .def_property_readonly("oom_count", &DeviceMemory::oom_count)
      .def("summary", &DeviceMemory::summary);
  m.def(
      "make_device_memory",
      [](const std::string& device, std::optional<int64_t> limit) {
        return make_device_memory(parse_device(device), limit);
      },
      py::arg("device"), py::arg("limit") = py::none(),
      "Memory of `device` (cpu, cuda, cuda:N). On the CPU this installs the byte-budget "
      "allocator in the process (Python's tensors are counted from then on) with `limit` "
      "bytes, or half the available RAM.");
  m.def("budget_installed", [] { return BudgetAllocator::installed() != nullptr; });
  m.def("budget_live_bytes", [] {
    auto* b = BudgetAllocator::installed();
    return b ? b->live_bytes() : int64_t{0};
  });
  m.def("budget_set", [](int64_t bytes) {
    BudgetAllocator::install().set_budget(bytes < 0 ? BudgetAllocator::kUnlimited : bytes);
  });
  m.def("budget_oom_count", [] {
    auto* b = BudgetAllocator::installed();
    return b ? b->oom_count() : int64_t{0};
  });
  m.def("budget_get", [] {
    auto* b = BudgetAllocator::installed();
    return b ? b->budget() : BudgetAllocator::kUnlimited;
  });
  // Whether a tensor's memory is the budget's: made after it was installed
  // (a storage keeps the deleter of the allocator that made it).
  m.def("budget_counts", [](const at::Tensor& tensor) {
    auto* b = BudgetAllocator::installed();
    if (b == nullptr || !tensor.defined() || !tensor.has_storage()) return false;
    return tensor.storage().data_ptr().get_deleter() == b->raw_deleter();
  });
  m.def(
      "budget_count_only",
      [](const std::vector<at::Tensor>& device) {
        std::unordered_set<const void*> pointers;
        for (const auto& t : device) {
          if (t.defined() && t.has_storage()) pointers.insert(t.storage().data_ptr().get());
        }
        auto* b = BudgetAllocator::installed();
        return b ? b->count_only(pointers) : int64_t{0};
      },
      py::arg("device"),
      "Stops counting every live CPU block but the storages of `device` (the model's and "
      "optimizer's tensors); returns the bytes now counted as host memory.");
  m.attr("UNLIMITED") = BudgetAllocator::kUnlimited;
  m.def("parse_size", &parse_size, py::arg("text"), py::arg("what") = "memory_limit");
  m.def("format_bytes", &format_bytes);
  py::class_<UncountedContext>(m, "uncounted",
                               "Allocations on this thread inside it are not counted against "
                               "the emulated budget.")
      .def(py::init<>())
      .def("__enter__", [](UncountedContext& c) { c.enter(); })
      .def("__exit__", [](UncountedContext& c, py::args) {
        c.exit();
        return false;
      });
}

void bind_trial(py::module_& m) {
  py::class_<TrialOptions>(m, "TrialOptions")
      .def(py::init([](int64_t batch_size, int64_t steps, int64_t warmup_steps,
                     int64_t max_warmup_steps, double min_time_s) {
             return TrialOptions()
                 .batch_size(batch_size)
                 .steps(steps)
                 .warmup_steps(warmup_steps)
                 .max_warmup_steps(max_warmup_steps)
                 .min_time_s(min_time_s);
           }),
           py::arg("batch_size") = 1, py::arg("steps") = 3, py::arg("warmup_steps") = 1,
           py::arg("max_warmup_steps") = 0, py::arg("min_time_s") = 0.0)
      .def_property_readonly("batch_size", [](const TrialOptions& o) { return o.batch_size(); })
      .def_property_readonly("steps", [](const TrialOptions& o) { return o.steps(); })
      .def_property_readonly("warmup_steps", [](const TrialOptions& o) { return o.warmup_steps(); });

  py::class_<TrialResult>(m, "TrialResult", "What one trial measured (plain data).")
      .def(py::init<>())
      .def_readwrite("batch_size", &TrialResult::batch_size)
      .def_readwrite("fits", &TrialResult::fits)
      .def_property_readonly("amp", [](const TrialResult& t) { return amp_name(t.amp); })
      .def_property(
          "failure", [](const TrialResult& t) { return std::string(failure_name(t.failure)); },
          [](TrialResult& t, const std::string& name) {
            t.failure = name == "out_of_memory"  ? TrialFailure::kOutOfMemory
                        : name == "over_budget"  ? TrialFailure::kOverBudget
                        : name == "does_not_run" ? TrialFailure::kDoesNotRun
                                                 : TrialFailure::kNone;
          })
      .def_readwrite("peak_bytes", &TrialResult::peak_bytes)
      .def_readwrite("capacity_bytes", &TrialResult::capacity_bytes)
      .def_readwrite("usable_bytes", &TrialResult::usable_bytes)
      .def_readwrite("margin", &TrialResult::margin)
      .def_readwrite("steps_run", &TrialResult::steps_run)
      .def_readwrite("step_seconds", &TrialResult::step_seconds)
      .def_readwrite("wait_seconds", &TrialResult::wait_seconds)
      .def_readwrite("busy", &TrialResult::busy)
      .def_readwrite("utilization", &TrialResult::utilization)
      .def_readwrite("energy_joules", &TrialResult::energy_joules)
      .def_readwrite("step_ms", &TrialResult::step_ms)
      .def_readwrite("step_ms_spread", &TrialResult::step_ms_spread)
      .def_readwrite("samples_per_s", &TrialResult::samples_per_s)
      .def_readwrite("step_ms_ci", &TrialResult::step_ms_ci)
      .def_readwrite("samples_per_s_ci", &TrialResult::samples_per_s_ci)
      .def_readwrite("warmup_steps_run", &TrialResult::warmup_steps_run)
      .def_readwrite("noisy", &TrialResult::noisy)
      .def_readwrite("noise_cause", &TrialResult::noise_cause)
      .def_readwrite("loss", &TrialResult::loss)
      .def_readwrite("error", &TrialResult::error)
      .def("to_json", [](const TrialResult& t) { return dump(to_json(t)); });

  py::class_<Estimate>(m, "Estimate",
                       "A median with its distribution-free confidence interval [low, high] "
                       "at `level` from `n` readings.")
      .def(py::init<>())
      .def_readwrite("median", &Estimate::median)
      .def_readwrite("low", &Estimate::low)
      .def_readwrite("high", &Estimate::high)
      .def_readwrite("level", &Estimate::level)
      .def_readwrite("n", &Estimate::n)
      .def_property_readonly("noisy", &Estimate::noisy)
      .def("__repr__", [](const Estimate& e) {
        return "Estimate(median=" + std::to_string(e.median) + ", low=" + std::to_string(e.low) +
               ", high=" + std::to_string(e.high) + ", level=" + std::to_string(e.level) +
               ", n=" + std::to_string(e.n) + ")";
      });
  m.attr("CONFIDENCE_LEVEL") = kConfidenceLevel;
  m.attr("SWEEP_MIN_TIMED_SECONDS") = kSweepMinTimedSeconds;
  m.attr("SWEEP_MAX_WARMUP_STEPS") = kSweepMaxWarmupSteps;
  m.def(
      "classify_failure",
      [](const std::string& message, int64_t ooms_before, int64_t ooms_after) {
        StepFailureEvidence evidence;
        evidence.message = message;
        evidence.ooms_before = ooms_before;
        evidence.ooms_after = ooms_after;
        switch (classify_step_failure(evidence)) {
          case StepFailure::kOutOfMemory: return "out_of_memory";
          case StepFailure::kSizeRefusal: return "size_refusal";
          case StepFailure::kError: return "error";
        }
        return "error";
      },
      py::arg("message"), py::arg("ooms_before"), py::arg("ooms_after"),
      "What a failed step's error says about the batch size, as the C++ runner decides it: "
      "the allocator's out-of-memory counter first, then the message.");
}

void bind_search(py::module_& m) {
  py::class_<SearchResult>(m, "SearchResult")
      .def_property_readonly("strategy",
                             [](const SearchResult& s) { return to_string(s.strategy); })
      .def_readwrite("max_batch_size", &SearchResult::max_batch_size)
      .def_readwrite("smallest_failure", &SearchResult::smallest_failure)
      .def_readwrite("trials", &SearchResult::trials)
      .def_readwrite("steps", &SearchResult::steps)
      .def_readwrite("seconds", &SearchResult::seconds)
      .def_readwrite("hit_time_budget", &SearchResult::hit_time_budget)
      .def_readwrite("hit_max_batch", &SearchResult::hit_max_batch)
      .def_readwrite("stop_reason", &SearchResult::stop_reason)
      .def("to_json", [](const SearchResult& s) { return dump(to_json(s)); });

  m.attr("DEFAULT_MAX_BATCH") = kDefaultMaxBatch;
  m.attr("DEFAULT_TOLERANCE") = kDefaultThroughputTolerance;
  m.attr("DEFAULT_MARGIN") = kDefaultMargin;
  m.attr("MAX_MARGIN") = kMaxMargin;

  py::class_<SweepRow>(m, "SweepRow")
      .def_readwrite("batch_size", &SweepRow::batch_size)
      .def_readwrite("samples_per_s", &SweepRow::samples_per_s)
      .def_readwrite("samples_per_s_spread", &SweepRow::samples_per_s_spread)
      .def_readwrite("samples_per_s_ci", &SweepRow::samples_per_s_ci)
      .def_readwrite("step_ms_ci", &SweepRow::step_ms_ci)
      .def_readwrite("noisy", &SweepRow::noisy)
      .def_readwrite("noise_cause", &SweepRow::noise_cause)
      .def_readwrite("step_ms", &SweepRow::step_ms)
      .def_readwrite("busy", &SweepRow::busy)
      .def_readwrite("utilization", &SweepRow::utilization)
      .def_readwrite("peak_bytes", &SweepRow::peak_bytes)
      .def_readwrite("flops_per_s", &SweepRow::flops_per_s)
      .def_readwrite("mfu", &SweepRow::mfu)
      .def_readwrite("steps", &SweepRow::steps);

  py::class_<Selection>(m, "Selection")
      .def_readwrite("batch_size", &Selection::batch_size)
      .def_readwrite("reason", &Selection::reason)
      .def_readwrite("confidence", &Selection::confidence)
      .def_readwrite("contenders", &Selection::contenders);
  py::class_<Diagnosis>(m, "Diagnosis")
      .def_readwrite("kind", &Diagnosis::kind)
      .def_readwrite("text", &Diagnosis::text);
}

void bind_plan(py::module_& m) {
  m.def(
      "make_plan",
      [](int64_t micro_batch_size, int64_t target_batch, int64_t world_size, double base_lr,
         int64_t base_batch, const std::string& optimizer, const std::string& lr_scaling,
         int64_t warmup_steps, const std::string& amp, const std::string& amp_reason,
         int64_t workers, bool pin_memory, int64_t prefetch, int64_t multiple_of,
         const std::vector<std::pair<int64_t, double>>& speeds, double speed_tolerance) {
        std::vector<MeasuredSpeed> measured;
        for (const auto& [batch, samples_per_s] : speeds) measured.push_back({batch, samples_per_s});
        return dump(to_json(make_plan(PlanOptions()
                                          .front_end(FrontEnd::kPython)
                                          .micro_batch_size(micro_batch_size)
                                          .target_batch(target_batch)
                                          .world_size(world_size)
                                          .base_lr(base_lr)
                                          .base_batch(base_batch)
                                          .optimizer(optimizer)
                                          .lr_scaling(lr_scaling)
                                          .warmup_steps(warmup_steps)
                                          .amp(parse_amp(amp))
                                          .amp_reason(amp_reason)
                                          .workers(workers)
                                          .pin_memory(pin_memory)
                                          .prefetch(prefetch)
                                          .multiple_of(multiple_of)
                                          .speeds(measured)
                                          .speed_tolerance(speed_tolerance))));
      },
      py::arg("micro_batch_size"), py::arg("target_batch") = 0, py::arg("world_size") = 1,
      py::arg("base_lr") = 1e-3, py::arg("base_batch") = 0, py::arg("optimizer") = "adam",
      py::arg("lr_scaling") = "", py::arg("warmup_steps") = -1, py::arg("amp") = "off",
      py::arg("amp_reason") = "", py::arg("workers") = kDefaultWorkers,
      py::arg("pin_memory") = false, py::arg("prefetch") = kDefaultPrefetch,
      py::arg("multiple_of") = 1, py::arg("speeds") = std::vector<std::pair<int64_t, double>>{},
      py::arg("speed_tolerance") = kDefaultThroughputTolerance,
      "The plan as JSON text (the fields of `batchtune plan --json`); `speeds` are "
      "(batch size, samples/s) rows for the cost of a smaller micro-batch that reaches "
      "`target_batch` exactly.");
  m.def(
      "check_plan_json",
      [](const std::string& text, const std::string& source) {
        return dump(to_json(parse_plan_json(text, source)));
      },
      "Reads and checks a plan (JSON text); returns it as JSON text.");
  m.def("scheduled_lr", &scheduled_lr, py::arg("lr"), py::arg("warmup_steps"), py::arg("step"));
  m.def("choose_cuda_amp", [](int major, int minor) {
    const AmpChoice choice = choose_cuda_amp(major, minor);
    return py::make_tuple(amp_name(choice.mode), choice.reason);
  });
}

void bind_report(py::module_& m) {
  py::class_<TuneResult>(m, "TuneReport", "Everything a tune found; JSON and HTML are views.")
      .def_readwrite("workload", &TuneResult::workload)
      .def_readwrite("device", &TuneResult::device)
      .def_readwrite("threads", &TuneResult::threads)
      .def_readwrite("search", &TuneResult::search)
      .def_readwrite("sweep", &TuneResult::sweep)
      .def_property_readonly("objective",
                             [](const TuneResult& r) { return to_string(r.objective); })
      .def_readwrite("selection", &TuneResult::selection)
      .def_readwrite("diagnosis", &TuneResult::diagnosis)
      .def_readwrite("capacity_bytes", &TuneResult::capacity_bytes)
      .def_readwrite("usable_bytes", &TuneResult::usable_bytes)
      .def_readwrite("margin", &TuneResult::margin)
      .def_readwrite("utilization_note", &TuneResult::utilization_note)
      .def_readwrite("complete", &TuneResult::complete)
      .def_readwrite("energy_note", &TuneResult::energy_note)
      .def_readwrite("interrupted_by", &TuneResult::interrupted_by)
      .def_readwrite("amp_reason", &TuneResult::amp_reason)
      .def_readwrite("amp_confidence", &TuneResult::amp_confidence)
      .def_readwrite("budget_note", &TuneResult::budget_note)
      .def_property_readonly("amp", [](const TuneResult& r) { return amp_name(r.amp); })
      .def_readonly("rank_max_batch_size", &TuneResult::rank_max_batch_size)
      .def_readonly("time_budget_s", &TuneResult::time_budget_s)
      .def_property_readonly("timeline_points",
                             [](const TuneResult& r) { return r.timeline.size(); })
      .def_property_readonly(
          "plan_json",
          [](const TuneResult& r) -> std::optional<std::string> {
            if (!r.plan) return std::nullopt;
            return dump(to_json(*r.plan));
          },
          "The plan as JSON text (the fields of `batchtune plan --json`), or None.")
      .def("to_json", [](const TuneResult& r) { return dump(to_json(r)); })
      .def(
          "set_checkpointing",
          [](TuneResult& r, bool on, const std::vector<std::string>& modules,
             const std::string& reason) {
            if (!r.plan) return;
            r.plan->checkpointing = on;
            r.plan->checkpoint_modules = on ? modules : std::vector<std::string>{};
            if (!reason.empty()) r.plan->reasons.push_back({PlanField::kNote, reason});
          },
          py::arg("on"), py::arg("modules"), py::arg("reason"),
          "The activation checkpointing the plan keeps, and why (a reason of its own).")
      .def(
          "set_activation_memory_budget",
          [](TuneResult& r, double budget) {
            if (r.plan && r.plan->checkpointing) r.plan->activation_memory_budget = budget;
          },
          py::arg("budget"),
          "With checkpointing kept on a compiled model: the selective-checkpointing budget "
          "that stands for it.")
      .def(
          "set_memory_format",
          [](TuneResult& r, const std::string& format, const std::string& reason) {
            if (!r.plan) return;
            r.plan->memory_format = format;
            if (!reason.empty()) r.plan->reasons.push_back({PlanField::kNote, reason});
          },
          py::arg("format"), py::arg("reason"),
          "The memory format the plan keeps (\"channels_last\" or \"contiguous\"), and why.")
      .def(
          "write_report",
          [](const TuneResult& r, const std::string& path) {
            write_file_atomically(path, html_report(r));
          },
          py::arg("path"), "The HTML report of this result, written whole.");
}

}  // namespace
}  // namespace batchtune::python

PYBIND11_MODULE(_core, m) {
  using namespace batchtune;
  using namespace batchtune::python;
  m.doc() = "batchtune's C++ core (search, sweep, plan, memory, reports); see the batchtune package";
  // Bad input: ValueError with the one-line message. An emulated out-of-memory
  // raised by C++ code itself: torch.OutOfMemoryError, as PyTorch raises it.
  static py::exception<Error> error(m, "Error", PyExc_ValueError);
  error.attr("option") = py::none();  // an OptionError's Python name (`memory_limit`)
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const OptionError& e) {
      // Named as Python names it (`memory_limit`), the option as data.
      py::object raised = py::reinterpret_borrow<py::object>(error.ptr())(e.message(FrontEnd::kPython));
      raised.attr("option") = option_name(e.option(), FrontEnd::kPython);
      PyErr_SetObject(error.ptr(), raised.ptr());
    } catch (const Error& e) {
      py::set_error(error, e.what());
    } catch (const Interrupted&) {
      // A KeyboardInterrupt from the Python subject, passed through a trial.
      PyErr_SetNone(PyExc_KeyboardInterrupt);
    } catch (const c10::OutOfMemoryError& e) {
      py::object oom = py::module_::import("torch").attr("OutOfMemoryError");
      py::set_error(oom, first_line(e.what_without_backtrace()).c_str());
    } catch (const c10::Error& e) {
      py::set_error(PyExc_RuntimeError, first_line(e.what_without_backtrace()).c_str());
    }
  });
  m.def("env_json", [] { return dump(to_json(collect_environment())); },
        "`batchtune env --json` as JSON text.");
  bind_memory(m);
  bind_trial(m);
  bind_search(m);
  bind_plan(m);
  bind_report(m);
  bind_trial_subject(m);
  bind_tune(m);
  bind_adapt(m);
  bind_tokens(m);
  bind_preflight(m);
}
