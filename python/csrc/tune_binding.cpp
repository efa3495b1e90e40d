// batchtune._core.tune: the library's pipeline (`batchtune::tune` over a
// `TrialRunner`) for the Python package — the same search, sweep, choice,
// plan, time budget, monitor and reports as `batchtune tune`, with Python
// supplying the subject (trial_subject.cpp), the process group (a
// `Communicator` over torch.distributed) and, optionally, a reporter.
#include "tune_binding.h"

#include <pybind11/iostream.h>
#include <pybind11/stl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>

#include <fmt/format.h>

#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "batchtune/common/atomic_file.h"
#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/distributed/data_parallel.h"
#include "batchtune/step/lockstep.h"
#include "batchtune/distributed/distributed.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/monitoring/monitor.h"
#include "batchtune/monitoring/sampler.h"
#include "batchtune/plan/plan.h"
#include "batchtune/reports/tune_report.h"
#include "batchtune/step/amp.h"
#include "batchtune/step/trial.h"
#include "batchtune/tuning/plan_request.h"
#include "batchtune/tuning/tune.h"
#include "trial_subject.h"

namespace py = pybind11;

namespace batchtune::python {
namespace {

/// As `batchtune tune`'s monitor: fast enough for short sweep trials.
constexpr double kTuneMonitorIntervalMs = 50;
/// What the CPU's loader note says from Python: there is no data set to time.
constexpr const char* kPythonLoaderNote =
    "loader tuning skipped: from Python the data are make_batch's";

/// A `TuneReporter` whose methods may be Python's (a subclass of
/// `_core.TuneReporter`). A KeyboardInterrupt in one of them asks the tune to
/// stop at its next check, as one inside a trial does.
class PyTuneReporter : public TuneReporter {
 public:
  using TuneReporter::TuneReporter;

  void phase_started(TunePhase phase, const std::string& what) override {
    call("phase_started", to_string(phase), what);
  }
  void trial_started(TunePhase phase, int64_t batch_size) override {
    call("trial_started", to_string(phase), batch_size);
  }
  void trial_finished(TunePhase phase, const TrialResult& trial, size_t index) override {
    // Copies: Python may keep what it is given beyond the call.
    py::gil_scoped_acquire gil;
    call("trial_finished", to_string(phase), py::cast(TrialResult(trial)), index);
  }
  void phase_finished(TunePhase phase, const TuneResult& result) override {
    py::gil_scoped_acquire gil;
    call("phase_finished", to_string(phase), py::cast(TuneResult(result)));
  }
  void finished(const TuneResult& result) override {
    py::gil_scoped_acquire gil;
    call("finished", py::cast(TuneResult(result)));
  }

 private:
  template <typename... Args>
  void call(const char* name, Args&&... args) {
    py::gil_scoped_acquire gil;
    py::function method = py::get_override(static_cast<const TuneReporter*>(this), name);
    if (!method) return;
    try {
      method(std::forward<Args>(args)...);
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_KeyboardInterrupt)) throw;
      note_keyboard_interrupt();
    }
  }
};

/// A `Lockstep` with the ranks it meets: the Trainer's, over the user's group.
struct GroupLockstep {
  explicit GroupLockstep(Communicator* communicator) : ranks(communicator), lockstep(ranks) {}
  DataParallel ranks;
  Lockstep lockstep;
};

/// A `Communicator` whose collectives are Python's: the package's
/// `TorchCommunicator` runs them on the user's own torch.distributed group
/// (no second rendezvous). Tensors are passed as they are and changed in
/// place, as the C++ collectives change them.
class PyCommunicator : public Communicator {
 public:
  using Communicator::Communicator;

  int64_t rank() const override { return call("rank").cast<int64_t>(); }
  int64_t world_size() const override { return call("world_size").cast<int64_t>(); }
  std::string backend() const override { return call("backend").cast<std::string>(); }
  c10::Device device() const override {
    return c10::Device(call("device").cast<std::string>());
  }
  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    const char* name = op == ReduceOp::kSum ? "sum" : op == ReduceOp::kMax ? "max" : "min";
    call("all_reduce", tensor, std::string(name));
  }
  std::unique_ptr<PendingCollective> start_all_reduce_sum(at::Tensor& tensor) override {
    all_reduce(tensor, ReduceOp::kSum);  // done when it returns
    struct Done : PendingCollective {
      void wait() override {}
    };
    return std::make_unique<Done>();
  }
  void broadcast(std::vector<at::Tensor>& tensors, int64_t root) override {
    call("broadcast", tensors, root);
  }
  void report_failure(const std::string& message) override {
    py::gil_scoped_acquire gil;
    if (py::function f = py::get_override(static_cast<const Communicator*>(this), "report_failure")) {
      f(message);
    }
  }

 private:
  template <typename... Args>
  py::object call(const char* name, Args&&... args) const {
    py::gil_scoped_acquire gil;
    py::function method = py::get_override(static_cast<const Communicator*>(this), name);
    if (!method) throw Error(std::string("Communicator: the Python communicator has no ") + name);
    return method(std::forward<Args>(args)...);
  }
};

/// Asked before every trial: a KeyboardInterrupt caught in a trial or a
/// reporter, or a Ctrl-C whose Python handler has not run yet (the tune is
/// in C++ between two Python calls).
std::optional<std::string> python_stop() {
  if (keyboard_interrupt_noted()) return std::string(kKeyboardInterrupt);
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) {
    if (!PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) throw py::error_already_set();
    PyErr_Clear();
    note_keyboard_interrupt();
    return std::string(kKeyboardInterrupt);
  }
  return std::nullopt;
}

/// The Python adapter of the pipeline's subject: `make_runner(amp)` gives
/// the `TrialRunner` of each precision (the package's `Runner` over the
/// user's model, optimizer, loss and batches), kept alive for the whole
/// tune; its plans are subject plans; the batches are `make_batch`'s, so no
/// loader is timed.
class PythonSubject final : public TuneSubject {
 public:
  PythonSubject(py::function make_runner, std::optional<LengthRange> lengths,
                int64_t gradient_bytes, std::optional<double> flops_per_sample)
      : make_runner_(std::move(make_runner)),
        lengths_(lengths),
        gradient_bytes_(gradient_bytes),
        flops_per_sample_(flops_per_sample) {}
  ~PythonSubject() override {
    py::gil_scoped_acquire gil;
    runners_.clear();
  }

  TrialRunner& runner(AmpMode amp) override {
    py::gil_scoped_acquire gil;
    auto& runner = runners_[amp];
    if (!runner) runner = make_runner_(amp_name(amp));
    return runner.cast<TrialRunner&>();
  }
  Plan plan(const PlanRequest& request, const MicroBatchChoice& micro, const AmpChoice& amp,
            const DeviceMemory& memory) override {
    return build_subject_plan(request, micro, amp, memory.device().is_cuda());
  }
  std::string loader_skipped_note() const override { return kPythonLoaderNote; }
  std::optional<LengthRange> length_range() const override { return lengths_; }
  int64_t gradient_bytes() const override { return gradient_bytes_; }
  std::optional<double> flops_per_sample() const override { return flops_per_sample_; }

 private:
  py::function make_runner_;
  std::optional<LengthRange> lengths_;
  int64_t gradient_bytes_;
  std::optional<double> flops_per_sample_;
  std::map<AmpMode, py::object> runners_;
};

/// `sources` keyed by the options' Python names (`{"base_lr": "the
/// optimizer's lr"}`); a name that is no option is the package's own bug.
OptionSources python_sources(const std::map<std::string, std::string>& sources) {
  OptionSources out;
  for (const auto& [name, words] : sources) {
    const std::optional<Option> option = find_option(name, FrontEnd::kPython);
    TORCH_CHECK(option.has_value(), "TuneOptions: sources: '", name, "' is no option's Python name");
    out.emplace(*option, words);
  }
  return out;
}

TuneResult run_tune(const py::function& make_runner, DeviceMemory& memory,
                    const ResolvedTuneOptions& resolved, TuneReporter* reporter,
                    Communicator* communicator, bool verbose, const std::string& report,
                    std::optional<std::pair<int64_t, int64_t>> lengths, int64_t gradient_bytes,
                    const py::object& compile, std::optional<double> flops_per_sample) {
  ResolvedTuneOptions options = resolved;
  clear_keyboard_interrupt();
  options.stop(python_stop);
  DataParallel data_parallel(communicator);
  options.data_parallel(&data_parallel);
  const bool primary = data_parallel.rank() == 0;
  Monitor monitor(make_sampler(memory.device()),
                  MonitorOptions().interval_ms(kTuneMonitorIntervalMs));
  options.monitor(&monitor);

  TuneReporters reporters;
  // The CLI's console output, into Python's sys.stderr (pytest captures it).
  std::optional<py::scoped_estream_redirect> to_python_stderr;
  std::optional<ConsoleTuneReporter> console;
  if (verbose && primary) {
    to_python_stderr.emplace();
    console.emplace(std::cerr);
    reporters.add(&*console);
  }
  if (reporter != nullptr) reporters.add(reporter);

  std::optional<LengthRange> range;
  if (lengths) range = LengthRange{lengths->first, lengths->second};
  PythonSubject subject(make_runner, range, gradient_bytes, flops_per_sample);
  TuneResult r = tune(subject, memory, options, &reporters);
  if (!compile.is_none()) {
    // A compiled model: what compiling took, known once the trials ran.
    const auto [seconds, graphs, recompiles, note] =
        compile().cast<std::tuple<double, int64_t, int64_t, std::string>>();
    r.compile = CompileRecord{seconds, graphs, recompiles, note};
  }
  if (!report.empty() && primary && (!r.sweep.empty() || !r.complete)) {
    write_file_atomically(report, html_report(r));
  }
  return r;
}

}  // namespace

void bind_tune(py::module_& m) {
  py::class_<TuneOptions>(m, "TuneOptions",
                          "How a tune runs (the C++ TuneOptions; the package's tune() fills it).")
      .def(py::init([](const std::string& amp, double margin, const std::string& strategy,
                       int64_t max_batch, double search_tolerance,
                       double time_budget_s, const std::string& objective, double tolerance,
                       std::optional<int64_t> target_batch, std::optional<double> base_lr,
                       std::optional<int64_t> base_batch, std::optional<std::string> lr_scaling,
                       std::optional<int64_t> warmup_steps, std::optional<std::string> optimizer,
                       std::optional<int64_t> multiple_of, const std::string& command_line,
                       bool sweep, std::optional<int64_t> world_size,
                       const std::map<std::string, std::string>& sources,
                       std::optional<double> mean_length) {
             PlanRequest request;
             request.target_batch = target_batch;
             request.base_lr = base_lr;
             request.base_batch = base_batch;
             if (lr_scaling) request.lr_scaling = parse_lr_scaling(*lr_scaling, "lr_scaling");
             request.warmup_steps = warmup_steps;
             request.optimizer = optimizer;
             request.multiple_of = multiple_of;
             if (world_size) request.world_size = *world_size;
             request.sources = python_sources(sources);
             request.mean_length = mean_length;
             return TuneOptions()
                 .front_end(FrontEnd::kPython)
                 .amp(parse_amp(amp))
                 .margin(margin)
                 .search(SearchOptions()
                             .strategy(parse_search_strategy(strategy))
                             .max_batch(max_batch)
                             .tolerance(search_tolerance))
                 .time_budget_s(time_budget_s)
                 .objective(parse_objective(objective))
                 .tolerance(tolerance)
                 .plan(request)
                 .sweep(sweep)
                 .command_line(command_line);
           }),
           py::arg("amp") = "auto", py::arg("margin") = kDefaultMargin,
           py::arg("strategy") = "predict", py::arg("max_batch") = kDefaultMaxBatch,
           py::arg("search_tolerance") = kDefaultSearchTolerance,
           py::arg("time_budget_s") = kDefaultTimeBudgetSeconds,
           py::arg("objective") = "throughput", py::arg("tolerance") = kDefaultThroughputTolerance,
           py::arg("target_batch") = py::none(), py::arg("base_lr") = py::none(),
           py::arg("base_batch") = py::none(), py::arg("lr_scaling") = py::none(),
           py::arg("warmup_steps") = py::none(), py::arg("optimizer") = py::none(),
           py::arg("multiple_of") = py::none(), py::arg("command_line") = "",
           py::arg("sweep") = true, py::arg("world_size") = py::none(),
           py::arg("sources") = std::map<std::string, std::string>{},
           py::arg("mean_length") = py::none())
      .def_property_readonly("time_budget_s", [](const TuneOptions& o) { return o.time_budget_s(); })
      .def_property_readonly("max_batch", [](const TuneOptions& o) { return o.search().max_batch(); })
      .def("resolve", [](const TuneOptions& o) { return resolve(o); },
           "Every option checked once (batchtune.Error naming it), the result what tune takes.");

  py::class_<ResolvedTuneOptions>(m, "ResolvedTuneOptions",
                                  "TuneOptions checked and completed (TuneOptions.resolve()).");

  py::class_<TuneReporter, PyTuneReporter>(
      m, "TuneReporter",
      "What a tune reports as it goes; subclass and override phase_started(phase, what), "
      "trial_started(phase, batch_size), trial_finished(phase, trial, index), "
      "phase_finished(phase, result), finished(result). Phases: precision, search, lengths, "
      "sweep, noise, eval, plan, loader.")
      .def(py::init<>());

  py::class_<Communicator, PyCommunicator>(
      m, "Communicator",
      "The collectives of a process group, from Python: rank(), world_size(), backend(), "
      "device() (a device string), all_reduce(tensor, op) (op sum, max or min; in place), "
      "broadcast(tensors, root) (in place), report_failure(message).")
      .def(py::init<>());
  py::class_<GroupLockstep>(
      m, "GroupLockstep",
      "A Lockstep over a Communicator's group, for steps outside a tune (the Trainer's): "
      "begin_trial(n), check_peers(), failure_agreed(), fail(error=False), as Lockstep's.")
      .def(py::init<Communicator*>(), py::arg("communicator"), py::keep_alive<1, 2>())
      .def("begin_trial", [](GroupLockstep& g, int64_t n) { g.lockstep.begin_trial(n); })
      .def("check_peers", [](GroupLockstep& g) { return g.lockstep.check_peers(); })
      .def("failure_agreed", [](GroupLockstep& g) { return g.lockstep.failure_agreed(); })
      .def("fail", [](GroupLockstep& g, bool error) { g.lockstep.fail(error); },
           py::arg("error") = false);

  m.def("tune", &run_tune, py::arg("make_runner"), py::arg("memory"), py::arg("options"),
        py::arg("reporter") = nullptr, py::arg("communicator") = nullptr,
        py::arg("verbose") = false, py::arg("report") = "", py::arg("lengths") = py::none(),
        py::arg("gradient_bytes") = 0, py::arg("compile") = py::none(),
        py::arg("flops_per_sample") = py::none(),
        "batchtune::tune: precision, search, sweep, choice, plan under one time budget, with the "
        "utilization monitor; `make_runner(amp)` gives the TrialRunner of each precision it "
        "measures or picks; the result as `TuneReport`. A KeyboardInterrupt in a trial ends it "
        "with what was measured (complete False). `lengths` (shortest, longest): sequences, "
        "with the length phase and a token budget (`gradient_bytes` kept free for the "
        "gradients held while micro-batches accumulate). `compile`: for a compiled model, "
        "`compile()` → (seconds, graphs, recompiles, note), asked after the trials. "
        "`flops_per_sample`: the forward's FLOPs a sample, for the rows' FLOP/s and MFU.");
  m.def(
      "tune",
      [](const py::function& make_runner, DeviceMemory& memory, const TuneOptions& options,
         TuneReporter* reporter, Communicator* communicator, bool verbose,
         const std::string& report) {
        return run_tune(make_runner, memory, resolve(options), reporter, communicator, verbose,
                        report, std::nullopt, 0, py::none(), std::nullopt);
      },
      py::arg("make_runner"), py::arg("memory"), py::arg("options"),
      py::arg("reporter") = nullptr, py::arg("communicator") = nullptr,
      py::arg("verbose") = false, py::arg("report") = "",
      "The same over options not resolved yet: resolved first (TuneOptions.resolve()).");

  m.def(
      "measure_cpu_amp",
      [](TrialRunner& fp32, TrialRunner& bf16, int64_t max_batch) {
        AmpMeasureOptions options;
        options.max_batch = max_batch;
        const AmpChoice choice = measure_cpu_amp(fp32, bf16, options);
        return py::make_tuple(amp_name(choice.mode), choice.reason, choice.confidence);
      },
      py::arg("fp32"), py::arg("bf16"), py::arg("max_batch") = kAmpProbeMaxBatch,
      "amp auto on the CPU: interleaved fp32 and bf16 rounds; (mode, reason, confidence or "
      "None when inconclusive).");
  m.attr("AMP_PROBE_MAX_BATCH") = kAmpProbeMaxBatch;
  // The defaults the package's signatures show, from the C++ options.
  m.attr("DEFAULT_TIME_BUDGET") = kDefaultTimeBudgetSeconds;
  m.attr("DEFAULT_SEARCH_TOLERANCE") = kDefaultSearchTolerance;
}

}  // namespace batchtune::python
