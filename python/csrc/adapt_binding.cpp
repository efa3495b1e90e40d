#include "adapt_binding.h"

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "batchtune/data/sample_cursor.h"
#include "batchtune/plan/plan.h"
#include "batchtune/step/noise_scale.h"
#include "batchtune/step/successive_gradients.h"
#include "batchtune/training/batch_adapter.h"

namespace py = pybind11;

namespace batchtune::python {
namespace {

py::dict change_dict(const BatchChange& c) {
  py::dict d;
  d["step"] = c.step;
  d["global_batch_size"] = c.global_batch_size;
  d["micro_batch_size"] = c.micro_batch_size;
  d["accumulation_steps"] = c.accumulation_steps;
  d["lr"] = c.lr;
  d["noise_scale"] = c.noise_scale ? py::cast(*c.noise_scale) : py::none();
  d["reason"] = c.reason;
  return d;
}

/// A copy (the kept tensors are overwritten at the next step), or None.
py::object copy_or_none(const at::Tensor& t) {
  return t.defined() ? py::cast(t.clone()) : py::none();
}

/// One kept step of SuccessiveGradients as a checkpoint's dict holds it.
py::dict kept_to_dict(const SuccessiveGradients::Kept& kept) {
  py::list gradient;
  for (const auto& t : kept.gradient) gradient.append(copy_or_none(t));
  return py::dict(py::arg("gradient") = gradient, py::arg("sq_norm") = copy_or_none(kept.sq_norm),
                  py::arg("loss_scale") = copy_or_none(kept.loss_scale),
                  py::arg("size") = kept.size);
}

SuccessiveGradients::Kept kept_from_dict(const py::handle& dict) {
  SuccessiveGradients::Kept kept;
  for (const auto& t : dict["gradient"]) {
    kept.gradient.push_back(t.is_none() ? at::Tensor() : t.cast<at::Tensor>());
  }
  if (!dict["sq_norm"].is_none()) kept.sq_norm = dict["sq_norm"].cast<at::Tensor>();
  if (!dict["loss_scale"].is_none()) kept.loss_scale = dict["loss_scale"].cast<at::Tensor>();
  kept.size = dict["size"].cast<double>();
  return kept;
}

}  // namespace

void bind_adapt(py::module_& m) {
  m.attr("DEFAULT_ADAPT_EVERY") = kDefaultAdaptEvery;
  m.attr("DEFAULT_ADAPT_GROWTH") = kDefaultAdaptGrowth;
  m.attr("ADAPT_LR_RAMP_STEPS") = kAdaptLrRampSteps;
  py::class_<NoiseScaleEstimator>(m, "NoiseScaleEstimator",
                                  "The gradient noise scale from pairs of squared gradient norms.")
      .def(py::init<>())
      .def("add", &NoiseScaleEstimator::add, py::arg("small_batch"), py::arg("small_sq_norm"),
           py::arg("big_batch"), py::arg("big_sq_norm"))
      .def("noise_scale", &NoiseScaleEstimator::noise_scale)
      .def("measurements", &NoiseScaleEstimator::measurements)
      .def("interval",
           [](const NoiseScaleEstimator& e) -> std::optional<std::pair<double, double>> {
             const auto i = e.interval();
             if (!i) return std::nullopt;
             return std::make_pair(i->low, i->high);
           })
      .def("state", [](const NoiseScaleEstimator& e) { return e.state().dump(); })
      .def("load_state", [](NoiseScaleEstimator& e, const std::string& state) {
        e.load_state(nlohmann::json::parse(state));
      });
  m.def("squared_gradient_norm", &squared_gradient_norm, py::arg("parameters"),
        "The squared L2 norm of all the parameters' gradients, a float scalar on their device.");
  py::class_<SuccessiveGradients>(m, "SuccessiveGradients",
                                  "A step's gradient against the two steps' before "
                                  "(see successive_gradients.h).")
      .def(py::init<>())
      .def("measure",
           [](SuccessiveGradients& s, const std::vector<at::Tensor>& parameters, double size,
              std::optional<at::Tensor> loss_scale) -> py::object {
             auto m = s.measure(parameters, size, loss_scale.value_or(at::Tensor()));
             if (!m) return py::none();
             return py::make_tuple(m->small_batch, m->small_sq_norm, m->big_batch,
                                   m->big_sq_norm);
           },
           py::arg("parameters"), py::arg("size"), py::arg("loss_scale") = py::none())
      .def("reset", &SuccessiveGradients::reset)
      .def("state",
           [](const SuccessiveGradients& s) -> py::object {
             const SuccessiveGradients::State state = s.state();
             if (state.previous.size == 0) return py::none();
             return py::dict(py::arg("previous") = kept_to_dict(state.previous),
                             py::arg("earlier") = kept_to_dict(state.earlier),
                             py::arg("cross") = copy_or_none(state.cross));
           },
           "What a checkpoint keeps (None when nothing is kept).")
      .def("load_state",
           [](SuccessiveGradients& s, const py::object& state) {
             if (state.is_none()) {
               s.reset();
               return;
             }
             SuccessiveGradients::State loaded;
             loaded.previous = kept_from_dict(state["previous"]);
             loaded.earlier = kept_from_dict(state["earlier"]);
             if (!state["cross"].is_none()) loaded.cross = state["cross"].cast<at::Tensor>();
             s.load_state(std::move(loaded));
           },
           py::arg("state"))
      .def_property_readonly("holding", &SuccessiveGradients::holding);
  m.def(
      "check_adapt_options",
      [](int64_t every, int64_t max_global_batch, const std::string& lr,
         int64_t min_global_batch) {
        check_adapt_options(AdaptOptions()
                                .every(every)
                                .max_global_batch(max_global_batch)
                                .min_global_batch(min_global_batch)
                                .lr(parse_adapt_lr(lr)));
      },
      py::arg("every"), py::arg("max_global_batch"), py::arg("lr") = "gain",
      py::arg("min_global_batch") = 0,
      "Refuses adapt_every below 1, a negative adapt_max_batch or adapt_min_batch (0: the "
      "default) or an adapt_lr other than 'gain' or 'batch'.");
  py::class_<BatchAdapter>(m, "BatchAdapter", "The policy of `train --adapt` (see batch_adapter.h).")
      .def(py::init([](int64_t base_batch, double base_lr, const std::string& lr_scaling,
                       int64_t world_size, int64_t every, int64_t max_global_batch,
                       const std::string& lr, int64_t min_global_batch,
                       const std::map<int64_t, std::tuple<double, double, double>>& speeds) {
             // (median, low, high) by global batch, checked by the caller (_adapt.py).
             SpeedProfile speed_profile;
             for (const auto& [batch, s] : speeds) {
               speed_profile[batch] =
                   TunedSpeed(std::get<0>(s), std::get<1>(s), std::get<2>(s));
             }
             return BatchAdapter(base_batch, base_lr, parse_lr_scaling(lr_scaling, "lr_scaling"),
                                 world_size,
                                 AdaptOptions()
                                     .every(every)
                                     .max_global_batch(max_global_batch)
                                     .min_global_batch(min_global_batch)
                                     .lr(parse_adapt_lr(lr))
                                     .speed_profile(std::move(speed_profile)));
           }),
           py::arg("base_batch"), py::arg("base_lr"), py::arg("lr_scaling"),
           py::arg("world_size"), py::arg("every"), py::arg("max_global_batch"),
           py::arg("lr") = "gain", py::arg("min_global_batch") = 0,
           py::arg("speed_profile") = std::map<int64_t, std::tuple<double, double, double>>{})
      .def("observe", &BatchAdapter::observe, py::arg("global_batch"), py::arg("seconds"),
           py::arg("samples"))
      .def("end_window", &BatchAdapter::end_window, py::arg("global_batch"), py::arg("seconds"),
           py::arg("samples"))
      .def("restart_window", &BatchAdapter::restart_window, py::arg("seconds"),
           py::arg("samples"))
      .def("settles", &BatchAdapter::settles)
      .def("start_timing", &BatchAdapter::start_timing, py::arg("seconds"), py::arg("samples"))
      .def("speed", &BatchAdapter::speed)
      .def("cap_micro_batch", &BatchAdapter::cap_micro_batch)
      .def("split", &BatchAdapter::split)
      .def("lr_for", &BatchAdapter::lr_for)
      .def_property_readonly("max_global_batch", &BatchAdapter::max_global_batch)
      .def_property_readonly("min_global_batch", &BatchAdapter::min_global_batch)
      .def("decide_on",
           [](BatchAdapter& a, int64_t step, int64_t global_batch,
              const NoiseScaleEstimator& noise) -> py::object {
             const auto change = a.decide(step, global_batch, noise);
             return change ? py::object(change_dict(*change)) : py::none();
           },
           py::arg("step"), py::arg("global_batch"), py::arg("noise"))
      .def("state", [](const BatchAdapter& a) { return a.state().dump(); })
      .def("load_state", [](BatchAdapter& a, const std::string& state) {
        a.load_state(nlohmann::json::parse(state));
      });
  py::class_<SampleCursor>(m, "SampleCursor", "Which samples each step takes as the batch changes.")
      .def(py::init<int64_t, int64_t>(), py::arg("dataset_size"), py::arg("global_batch"))
      .def("change", &SampleCursor::change)
      .def("at", [](const SampleCursor& c, int64_t step) {
        const SamplePosition p = c.at(step);
        return std::make_pair(p.epoch, p.offset);
      })
      .def("global_batch", &SampleCursor::global_batch);
}

}  // namespace batchtune::python
