#include "preflight_binding.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <tuple>
#include <vector>

#include "batchtune/preflight/batch_estimate.h"
#include "batchtune/preflight/caching_allocator_model.h"
#include "batchtune/preflight/gpu_profile.h"

namespace py = pybind11;

namespace batchtune::python {
namespace {

using Events = std::vector<std::tuple<bool, int64_t, int64_t>>;

/// (allocate, id, bytes) tuples from Python: frees carry allocate False.
AllocationTrace to_trace(const Events& events) {
  AllocationTrace trace;
  trace.reserve(events.size());
  for (const auto& [allocate, id, bytes] : events) {
    trace.push_back(allocate ? AllocationEvent::allocate(id, bytes) : AllocationEvent::free(id));
  }
  return trace;
}

}  // namespace

void bind_preflight(py::module_& m) {
  py::class_<AllocatorReplay>(m, "AllocatorReplay",
                              "What a trace does to the modelled CUDA caching allocator.")
      .def_readonly("fits", &AllocatorReplay::fits)
      .def_readonly("peak_allocated", &AllocatorReplay::peak_allocated)
      .def_readonly("peak_reserved", &AllocatorReplay::peak_reserved)
      .def_readonly("peak_requested", &AllocatorReplay::peak_requested)
      .def_readonly("failed_event", &AllocatorReplay::failed_event)
      .def_readonly("failed_bytes", &AllocatorReplay::failed_bytes)
      .def_readonly("allocated_at_failure", &AllocatorReplay::allocated_at_failure)
      .def_readonly("reserved_at_failure", &AllocatorReplay::reserved_at_failure);
  m.def(
      "replay_trace",
      [](const Events& events, int64_t capacity) {
        AllocationTrace trace = to_trace(events);
        py::gil_scoped_release unlocked;
        return replay_trace(trace, capacity);
      },
      py::arg("events"), py::arg("capacity"),
      "Replays (allocate, id, bytes) events through the model of PyTorch's CUDA caching "
      "allocator under `capacity` bytes (frees: allocate False, bytes ignored).");
  m.attr("ALLOCATOR_MIN_BLOCK") = CachingAllocatorModel::kMinBlockSize;

  py::class_<GpuProfile>(m, "GpuProfile", "A GPU's memory for an estimate made without it.")
      .def_readonly("name", &GpuProfile::name)
      .def_readonly("description", &GpuProfile::description)
      .def_readonly("total_bytes", &GpuProfile::total_bytes)
      .def_readonly("context_low", &GpuProfile::context_low)
      .def_readonly("context_high", &GpuProfile::context_high)
      .def_readonly("cublas_workspace", &GpuProfile::cublas_workspace)
      .def_readonly("source", &GpuProfile::source)
      .def_readonly("emulated", &GpuProfile::emulated)
      .def("allocator_capacity", &GpuProfile::allocator_capacity, py::arg("conservative") = true);
  m.def("gpu_profile", &gpu_profile, py::arg("name"), py::arg("memory_limit") = 0,
        "The profile of the GPU named `name` (H100, H200, A100-80GB, ...; cpu with memory_limit).");
  m.def("gpu_profile_names", &gpu_profile_names);

  m.attr("UNSEEN_SHARE") = kUnseenShare;
  m.attr("MAX_ESTIMATE_BATCH") = kMaxEstimateBatch;
  py::class_<EstimateCapacity>(m, "EstimateCapacity")
      .def_readonly("low", &EstimateCapacity::low)
      .def_readonly("high", &EstimateCapacity::high);
  m.def("estimate_capacity", &estimate_capacity, py::arg("profile"), py::arg("margin"));
  m.def(
      "replay_on",
      [](const Events& events, const GpuProfile& profile, int64_t capacity) {
        AllocationTrace trace = to_trace(events);
        py::gil_scoped_release unlocked;
        return replay_on(trace, profile, capacity);
      },
      py::arg("events"), py::arg("profile"), py::arg("capacity"));
  py::class_<EstimateTrial>(m, "EstimateTrial")
      .def_readonly("batch_size", &EstimateTrial::batch_size)
      .def_readonly("capacity", &EstimateTrial::capacity)
      .def_readonly("fits", &EstimateTrial::fits)
      .def_readonly("peak_reserved", &EstimateTrial::peak_reserved)
      .def_readonly("peak_requested", &EstimateTrial::peak_requested);
  py::class_<BatchEstimate>(m, "BatchEstimate")
      .def_readonly("low", &BatchEstimate::low)
      .def_readonly("high", &BatchEstimate::high)
      .def_readonly("capacity", &BatchEstimate::capacity)
      .def_readonly("trials", &BatchEstimate::trials);
  m.def(
      "estimate_largest_batch",
      [](const std::function<Events(int64_t)>& trace_at, const GpuProfile& profile, double margin,
         int64_t max_batch) {
        return estimate_largest_batch([&](int64_t n) { return to_trace(trace_at(n)); }, profile,
                                      margin, max_batch);
      },
      py::arg("trace_at"), py::arg("profile"), py::arg("margin"),
      py::arg("max_batch") = kMaxEstimateBatch,
      "The largest batch whose traced step fits `profile` at both ends of the estimate; "
      "`trace_at(n)` returns the step's (allocate, id, bytes) events at batch n.");
  py::class_<MemoryBreakdown>(m, "MemoryBreakdown")
      .def_readonly("bytes", &MemoryBreakdown::bytes)
      .def_readonly("tensor_peak", &MemoryBreakdown::tensor_peak)
      .def_readonly("peak_bytes", &MemoryBreakdown::peak_bytes)
      .def_readonly("fits", &MemoryBreakdown::fits);
  m.def(
      "breakdown_at_peak",
      [](const Events& events, const std::map<int64_t, std::string>& category,
         const GpuProfile& profile, int64_t capacity) {
        return breakdown_at_peak(to_trace(events), category, profile, capacity);
      },
      py::arg("events"), py::arg("category"), py::arg("profile"), py::arg("capacity"));
  m.def("breakdown_keys", &breakdown_keys);
}

}  // namespace batchtune::python
