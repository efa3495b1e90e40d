// A plan as JSON: the writer (`to_json`) and the reader that checks every
// field (`plan_from_json`, `read_plan_file`).
#include "batchtune/plan/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/common/file_roles.h"
#include "common/json_depth.h"

namespace batchtune {

namespace {

std::vector<std::string> reason_texts(const Plan& plan) {
  std::vector<std::string> texts;
  for (const auto& r : plan.reasons) texts.push_back(r.text);
  return texts;
}

}  // namespace

nlohmann::json to_json(const Plan& plan) {
  nlohmann::json json = {
      {"micro_batch_size", plan.micro_batch_size},
      {"accumulation_steps", plan.accumulation_steps},
      {"world_size", plan.world_size},
      {"global_batch_size", plan.global_batch_size},
      {"lr", plan.lr},
      {"lr_scaling", lr_scaling_name(plan.lr_scaling)},
      {"warmup_steps", plan.warmup_steps},
      {"amp", amp_name(plan.amp)},
      {"workers", plan.workers},
      {"pin_memory", plan.pin_memory},
      {"prefetch", plan.prefetch},
      {"eval_micro_batch_size", plan.eval_micro_batch_size},
      {"reasons", reason_texts(plan)},
      {"warnings", plan.warnings},
      {"workload", to_json(plan.workload)},
  };
  if (plan.token_budget > 0) {
    json["token_budget"] = plan.token_budget;
    nlohmann::json buckets = nlohmann::json::array();
    for (const auto& b : plan.length_buckets) {
      buckets.push_back({{"max_length", b.max_length}, {"micro_batch_size", b.micro_batch_size}});
    }
    json["length_buckets"] = std::move(buckets);
    json["tokens_per_step"] = plan.tokens_per_step;
  }
  if (plan.checkpointing) {
    json["checkpointing"] = "on";
    json["checkpoint_modules"] = plan.checkpoint_modules;
    if (plan.activation_memory_budget > 0) {
      json["activation_memory_budget"] = plan.activation_memory_budget;
    }
  }
  if (plan.memory_format != "contiguous") json["memory_format"] = plan.memory_format;
  return json;
}

nlohmann::json to_json(const PlanWorkload& w) {
  return {
      {"model", w.model},
      {"input", w.input},
      {"optimizer", w.optimizer},
      {"base_lr", w.base_lr},
      {"base_batch", w.base_batch},
      {"device", w.device},
      {"memory_limit_bytes", w.memory_limit_bytes},
      {"parameters", w.parameters},
  };
}

namespace {

class PlanReader {
 public:
  PlanReader(const nlohmann::json& json, std::string source)
      : json_(json), source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw Error(fmt::format("{}: field '{}': {}", source_, field, what));
  }

  const nlohmann::json& field(const std::string& name) const {
    const auto it = json_.find(name);
    if (it == json_.end()) fail(name, "missing");
    return *it;
  }

  int64_t integer(const std::string& name, int64_t min, int64_t max = kMaxPlanCount) const {
    const auto& value = field(name);
    if (!value.is_number_integer()) fail(name, "must be an integer, got " + value.dump());
    // Unsigned values past int64 would wrap in get<int64_t>().
    if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(max)) {
      fail(name, fmt::format("must be at most {}, got {}", max, value.dump()));
    }
    const auto n = value.get<int64_t>();
    if (n < min) fail(name, fmt::format("must be at least {}, got {}", min, n));
    if (n > max) fail(name, fmt::format("must be at most {}, got {}", max, n));
    return n;
  }

  /// Refuses a field not among `known` (a misspelt field would otherwise
  /// be ignored, and its default used without a word).
  void only(std::initializer_list<const char*> known) const {
    for (const auto& [name, value] : json_.items()) {
      if (std::find_if(known.begin(), known.end(), [&](const char* k) { return name == k; }) ==
          known.end()) {
        fail(name, fmt::format("unknown; a plan's fields here are {}", fmt::join(known, ", ")));
      }
    }
  }

  std::string text(const std::string& name) const {
    const auto& value = field(name);
    if (!value.is_string()) fail(name, "must be a string, got " + value.dump());
    return value.get<std::string>();
  }

 private:
  const nlohmann::json& json_;
  std::string source_;
};

}  // namespace

Plan plan_from_json(const nlohmann::json& input, const std::string& source) {
  if (!input.is_object()) throw Error(source + ": a plan must be a JSON object");
  const nlohmann::json& json =
      input.contains("plan") && input["plan"].is_object() ? input["plan"] : input;
  const PlanReader r(json, source);
  r.only({"micro_batch_size", "accumulation_steps", "world_size", "global_batch_size", "lr",
          "lr_scaling", "warmup_steps", "amp", "workers", "pin_memory", "prefetch",
          "eval_micro_batch_size", "reasons", "warnings", "workload", "token_budget",
          "length_buckets", "tokens_per_step", "checkpointing", "checkpoint_modules",
          "activation_memory_budget", "memory_format"});
  Plan plan;
  plan.micro_batch_size = r.integer("micro_batch_size", 1);
  plan.accumulation_steps = r.integer("accumulation_steps", 1);
  plan.world_size = r.integer("world_size", 1);
  plan.global_batch_size = r.integer("global_batch_size", 1);
  const auto per_step = checked_product(plan.micro_batch_size, plan.world_size);
  const auto product = per_step ? checked_product(*per_step, plan.accumulation_steps)
                                : std::nullopt;
  if (!product) {
    r.fail("global_batch_size",
           fmt::format("micro_batch_size x accumulation_steps x world_size = {} x {} x {} is "
                       "more than {}",
                       plan.micro_batch_size, plan.accumulation_steps, plan.world_size,
                       kMaxPlanCount));
  }
  if (plan.global_batch_size != *product) {
    r.fail("global_batch_size",
           fmt::format("must be micro_batch_size x accumulation_steps x world_size = {}, got {}",
                       *product, plan.global_batch_size));
  }
  const auto& lr = r.field("lr");
  if (!lr.is_number() || !(lr.get<double>() > 0) || !std::isfinite(lr.get<double>())) {
    r.fail("lr", "must be a positive number, got " + lr.dump());
  }
  if (lr.get<double>() > kMaxLearningRate) {
    r.fail("lr", fmt::format("must be at most {:g}, got {}", kMaxLearningRate, lr.dump()));
  }
  plan.lr = lr.get<double>();
  try {
    plan.lr_scaling = parse_lr_scaling(r.text("lr_scaling"), "x");
  } catch (const Error&) {
    r.fail("lr_scaling", "must be linear, sqrt or none, got " + r.field("lr_scaling").dump());
  }
  plan.warmup_steps = r.integer("warmup_steps", 0);
  const std::string amp = r.text("amp");
  if (amp != "off" && amp != "bf16" && amp != "fp16") {
    r.fail("amp", "must be off, bf16 or fp16, got \"" + amp + "\"");
  }
  plan.amp = parse_amp(amp);
  plan.workers = r.integer("workers", 0, kMaxWorkers);
  const auto& pin = r.field("pin_memory");
  if (!pin.is_boolean()) r.fail("pin_memory", "must be true or false, got " + pin.dump());
  plan.pin_memory = pin.get<bool>();
  plan.prefetch = r.integer("prefetch", 0, kMaxPrefetch);
  if (json.contains("eval_micro_batch_size")) {
    plan.eval_micro_batch_size = r.integer("eval_micro_batch_size", 0);
  }
  if (json.contains("warnings")) {
    const auto& warnings = json["warnings"];
    if (!warnings.is_array()) r.fail("warnings", "must be a list of strings");
    for (const auto& warning : warnings) {
      if (!warning.is_string()) r.fail("warnings", "must be a list of strings");
      plan.warnings.push_back(warning.get<std::string>());
    }
  }
  if (json.contains("workload")) {
    const auto& w = json["workload"];
    if (!w.is_object()) r.fail("workload", "must be an object, got " + w.dump());
    const PlanReader wr(w, source + ": field 'workload'");
    wr.only({"model", "input", "optimizer", "base_lr", "base_batch", "device",
             "memory_limit_bytes", "parameters"});
    const auto text = [&](const char* name) {
      return w.contains(name) ? wr.text(name) : std::string();
    };
    plan.workload.model = text("model");
    plan.workload.input = text("input");
    plan.workload.optimizer = text("optimizer");
    plan.workload.device = text("device");
    if (w.contains("base_batch")) plan.workload.base_batch = wr.integer("base_batch", 0);
    if (w.contains("memory_limit_bytes")) {
      plan.workload.memory_limit_bytes =
          wr.integer("memory_limit_bytes", 0, std::numeric_limits<int64_t>::max());
    }
    if (w.contains("parameters")) {
      plan.workload.parameters =
          wr.integer("parameters", 0, std::numeric_limits<int64_t>::max());
    }
    if (w.contains("base_lr")) {
      const auto& v = w["base_lr"];
      if (!v.is_number() || !(v.get<double>() >= 0) || !std::isfinite(v.get<double>())) {
        wr.fail("base_lr", "must be a number, 0 or more, got " + v.dump());
      }
      plan.workload.base_lr = v.get<double>();
    }
  }
  if (json.contains("token_budget") != json.contains("length_buckets")) {
    r.fail(json.contains("token_budget") ? "length_buckets" : "token_budget",
           "missing; token_budget and length_buckets come together");
  }
  if (json.contains("token_budget")) {
    plan.token_budget = r.integer("token_budget", 1);
    const auto& buckets = json["length_buckets"];
    if (!buckets.is_array()) {
      r.fail("length_buckets", "must be a list of {\"max_length\", \"micro_batch_size\"}, got " +
                                   buckets.dump());
    }
    for (size_t i = 0; i < buckets.size(); ++i) {
      const auto& b = buckets[i];
      if (!b.is_object()) {
        r.fail("length_buckets", fmt::format("bucket {}: must be an object, got {}", i, b.dump()));
      }
      const PlanReader br(b, fmt::format("{}: field 'length_buckets' bucket {}", source, i));
      br.only({"max_length", "micro_batch_size"});
      plan.length_buckets.push_back(
          {br.integer("max_length", 1), br.integer("micro_batch_size", 1)});
    }
    check_length_buckets(plan.token_budget, plan.length_buckets, source);
    if (json.contains("tokens_per_step")) plan.tokens_per_step = r.integer("tokens_per_step", 0);
  } else if (json.contains("tokens_per_step")) {
    r.fail("tokens_per_step", "belongs to a token budget; give token_budget and length_buckets too");
  }
  if (json.contains("checkpointing")) {
    const std::string mode = r.text("checkpointing");
    if (mode != "on" && mode != "off") {
      r.fail("checkpointing", "must be \"on\" or \"off\", got \"" + mode + "\"");
    }
    plan.checkpointing = mode == "on";
  }
  if (json.contains("checkpoint_modules")) {
    const auto& modules = json["checkpoint_modules"];
    if (!plan.checkpointing) {
      r.fail("checkpoint_modules", "belongs to checkpointing \"on\"; give that too");
    }
    if (!modules.is_array()) r.fail("checkpoint_modules", "must be a list of class names");
    for (const auto& name : modules) {
      if (!name.is_string() || name.get<std::string>().empty()) {
        r.fail("checkpoint_modules", "must be a list of class names, got " + name.dump());
      }
      plan.checkpoint_modules.push_back(name.get<std::string>());
    }
  }
  if (json.contains("activation_memory_budget")) {
    const auto& budget = json["activation_memory_budget"];
    if (!plan.checkpointing) {
      r.fail("activation_memory_budget", "belongs to checkpointing \"on\"; give that too");
    }
    if (!budget.is_number() || !(budget.get<double>() > 0) || !(budget.get<double>() < 1)) {
      r.fail("activation_memory_budget",
             "must be a number above 0 and below 1, got " + budget.dump());
    }
    plan.activation_memory_budget = budget.get<double>();
  }
  if (json.contains("memory_format")) {
    plan.memory_format = r.text("memory_format");
    if (plan.memory_format != "channels_last" && plan.memory_format != "contiguous") {
      r.fail("memory_format",
             "must be \"channels_last\" or \"contiguous\", got \"" + plan.memory_format + "\"");
    }
  }
  if (json.contains("reasons")) {
    const auto& reasons = json["reasons"];
    if (!reasons.is_array()) r.fail("reasons", "must be a list of strings");
    for (const auto& reason : reasons) {
      if (!reason.is_string()) r.fail("reasons", "must be a list of strings");
      plan.reasons.push_back({PlanField::kNote, reason.get<std::string>()});
    }
  }
  return plan;
}

Plan parse_plan_json(const std::string& text, const std::string& source) {
  check_json_depth(text, source);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // syntax, and numbers out of range
    std::string what = e.what();
    throw Error(fmt::format("{}: not valid JSON ({})", source, what.substr(what.find(']') + 2)));
  }
  return plan_from_json(json, source);
}

Plan read_plan_file(const std::string& path) {
  check_input_file(path, Option::kPlan);
  std::ifstream in(path);
  if (!in) throw OptionError(Option::kPlan, path, "cannot open the file");
  std::stringstream text;
  text << in.rdbuf();
  return parse_plan_json(text.str(), "--plan " + path);
}

}  // namespace batchtune
