#include "training/checkpoint_json.h"

#include <optional>

#include "batchtune/training/batch_adapter.h"

namespace batchtune {
namespace {

nlohmann::json optional_json(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json();
}

std::optional<double> optional_double(const nlohmann::json& j) {
  if (j.is_null()) return std::nullopt;
  return j.get<double>();
}

nlohmann::json optional_json(const std::optional<int64_t>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json();
}

std::optional<int64_t> optional_int(const nlohmann::json& j) {
  if (j.is_null()) return std::nullopt;
  return j.get<int64_t>();
}

nlohmann::json target_json(const std::optional<TrainTarget>& t) {
  if (!t) return nlohmann::json();
  return {{"metric", t->metric}, {"value", t->value}};
}

}  // namespace

nlohmann::json to_json(const RunIdentity& r) {
  return {{"model", r.model},         {"input", r.input},
          {"optimizer", r.optimizer}, {"amp", r.amp},
          {"world_size", r.world_size}, {"global_batch_size", r.global_batch_size},
          {"train_size", r.train_size}, {"seed", r.seed},
          {"lr", r.lr},               {"warmup_steps", r.warmup_steps}};
}

RunIdentity identity_from_json(const nlohmann::json& j) {
  RunIdentity r;
  r.model = j.at("model").get<std::string>();
  r.input = j.at("input").get<std::string>();
  r.optimizer = j.at("optimizer").get<std::string>();
  r.amp = j.at("amp").get<std::string>();
  r.world_size = j.at("world_size").get<int64_t>();
  r.global_batch_size = j.at("global_batch_size").get<int64_t>();
  r.train_size = j.at("train_size").get<int64_t>();
  r.seed = j.at("seed").get<uint64_t>();
  r.lr = j.at("lr").get<double>();
  r.warmup_steps = j.at("warmup_steps").get<int64_t>();
  return r;
}

nlohmann::json to_json_full(const TrainSummary& s) {
  nlohmann::json schedule = nlohmann::json::array();
  for (const auto& change : s.batch_schedule) schedule.push_back(to_json(change));
  return {{"steps", s.steps},
          {"batch_schedule", schedule},
          {"samples", s.samples},
          {"epochs", s.epochs},
          {"final_loss", s.final_loss},
          {"test_accuracy", optional_json(s.test_accuracy)},
          {"oom_recoveries", s.oom_recoveries},
          {"micro_batch_size", s.micro_batch_size},
          {"accumulation_steps", s.accumulation_steps},
          {"global_batch_size", s.global_batch_size},
          {"world_size", s.world_size},
          {"skipped_steps", s.skipped_steps},
          {"seconds", s.seconds},
          {"samples_per_s", s.samples_per_s},
          {"data_wait_fraction", s.data_wait_fraction},
          {"resumed_from_step", s.resumed_from_step},
          {"complete", s.complete},
          {"interrupted_by", s.interrupted_by},
          {"noise_scale", optional_json(s.noise_scale)},
          {"target", target_json(s.target)},
          {"target_reached", s.target_reached},
          {"steps_to_target", optional_json(s.steps_to_target)},
          {"seconds_to_target", optional_json(s.seconds_to_target)},
          {"samples_to_target", optional_json(s.samples_to_target)}};
}

TrainSummary summary_from_json(const nlohmann::json& j) {
  TrainSummary s;
  s.steps = j.at("steps").get<int64_t>();
  s.samples = j.at("samples").get<int64_t>();
  s.epochs = j.at("epochs").get<double>();
  s.final_loss = j.at("final_loss").get<double>();
  s.test_accuracy = optional_double(j.at("test_accuracy"));
  s.oom_recoveries = j.at("oom_recoveries").get<int64_t>();
  s.micro_batch_size = j.at("micro_batch_size").get<int64_t>();
  s.accumulation_steps = j.at("accumulation_steps").get<int64_t>();
  s.global_batch_size = j.at("global_batch_size").get<int64_t>();
  s.world_size = j.at("world_size").get<int64_t>();
  s.skipped_steps = j.at("skipped_steps").get<int64_t>();
  s.seconds = j.at("seconds").get<double>();
  s.samples_per_s = j.at("samples_per_s").get<double>();
  s.data_wait_fraction = j.at("data_wait_fraction").get<double>();
  s.resumed_from_step = j.at("resumed_from_step").get<int64_t>();
  s.complete = j.at("complete").get<bool>();
  s.interrupted_by = j.at("interrupted_by").get<std::string>();
  s.noise_scale = optional_double(j.at("noise_scale"));
  // Checkpoints written before targets existed have none of these.
  if (j.contains("target") && !j.at("target").is_null()) {
    s.target = TrainTarget{j.at("target").at("metric").get<std::string>(),
                           j.at("target").at("value").get<double>()};
    s.target_reached = j.at("target_reached").get<bool>();
    s.steps_to_target = optional_int(j.at("steps_to_target"));
    s.seconds_to_target = optional_double(j.at("seconds_to_target"));
    s.samples_to_target = optional_int(j.at("samples_to_target"));
  }
  if (j.contains("batch_schedule")) {
    for (const auto& entry : j.at("batch_schedule")) {
      s.batch_schedule.push_back(batch_change_from_json(entry));
    }
  }
  return s;
}

}  // namespace batchtune
