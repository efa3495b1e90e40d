#include "batchtune/plan/plan.h"

#include <fmt/format.h>

#include "batchtune/common/error.h"

namespace batchtune {

std::string lr_scaling_name(LrScaling scaling) {
  switch (scaling) {
    case LrScaling::kLinear: return "linear";
    case LrScaling::kSqrt: return "sqrt";
    case LrScaling::kNone: return "none";
  }
  return "none";
}

LrScaling parse_lr_scaling(const std::string& text, const std::string& what) {
  for (LrScaling s : {LrScaling::kLinear, LrScaling::kSqrt, LrScaling::kNone}) {
    if (text == lr_scaling_name(s)) return s;
  }
  throw Error(fmt::format("{}: unknown scaling '{}'; use linear, sqrt or none", what, text));
}

LrScaling default_lr_scaling(const std::string& optimizer) {
  return optimizer == "sgd" ? LrScaling::kLinear : LrScaling::kSqrt;
}

void Plan::set_reason(PlanField field, std::string text) {
  for (auto& r : reasons) {
    if (r.field == field && field != PlanField::kNote) {
      r.text = std::move(text);
      return;
    }
  }
  reasons.push_back({field, std::move(text)});
}

std::string Plan::reason(PlanField field) const {
  for (const auto& r : reasons) {
    if (r.field == field) return r.text;
  }
  return {};
}

void check_plan_workload(const PlanWorkload& planned, const PlanWorkload& current,
                         const std::string& source, FrontEnd front_end) {
  const auto name = [&](Option option) { return option_name(option, front_end); };
  const auto differ = [&](const char* field, const std::string& a, const std::string& b,
                          const std::string& fix) {
    if (a.empty() || b.empty() || a == b) return;
    throw Error(fmt::format("{}: the plan was made for {} {}, this run has {}; {}", source,
                            field, a, b, fix));
  };
  differ("model", planned.model, current.model,
         fmt::format("use that {}, or make a plan for this one (batchtune tune)",
                     name(Option::kModel)));
  differ("input", planned.input, current.input,
         fmt::format("use the same {}, or make a plan for this input (batchtune tune)",
                     name(Option::kInput)));
  differ("optimizer", planned.optimizer, current.optimizer,
         fmt::format("use that {}, or make a plan for this one (batchtune tune)",
                     name(Option::kOptimizer)));
  differ("device", planned.device, current.device,
         fmt::format("train on that {}, or make a plan on this one (batchtune tune)",
                     name(Option::kDevice)));
  // Last of the names: another input or another build of the model changes
  // the count too, and is named as such above.
  if (planned.parameters > 0 && current.parameters > 0 &&
      planned.parameters != current.parameters && planned.model == current.model) {
    throw Error(fmt::format(
        "{}: the plan was made for {} of {} parameters, this run's has {}; give the model "
        "flags the plan was tuned with ({}, {}, ...), or make a plan for this one (batchtune "
        "tune)",
        source, planned.model.empty() ? "a model" : planned.model, planned.parameters,
        current.parameters, name(Option::kLayers), name(Option::kWidth)));
  }
  // A smaller budget than the plan was measured under: its micro-batch may
  // not fit. Within `kPlanMemoryTolerance` it is the same budget (without
  // --memory-limit a CPU's budget is the available RAM, which moves).
  if (planned.memory_limit_bytes > 0 && current.memory_limit_bytes > 0 &&
      static_cast<double>(current.memory_limit_bytes) <
          static_cast<double>(planned.memory_limit_bytes) * (1 - kPlanMemoryTolerance)) {
    throw Error(fmt::format("{}: the plan was measured with {} bytes usable, this run has only {}; "
                            "give the same {} and {}, or make a plan for this budget (batchtune "
                            "tune)",
                            source, planned.memory_limit_bytes, current.memory_limit_bytes,
                            name(Option::kMemoryLimit), name(Option::kMargin)));
  }
}

}  // namespace batchtune
