#include "batchtune/training/train_summary_json.h"

#include <optional>
#include <string>

#include "batchtune/training/batch_adapter.h"

namespace batchtune {
namespace {

template <typename T>
nlohmann::json optional_json(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json();
}

template <typename T>
std::optional<T> optional_field(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j.at(key).is_null()) return std::nullopt;
  return j.at(key).get<T>();
}

}  // namespace

nlohmann::json to_json(const TrainSummary& s) {
  nlohmann::json j = {
      {"steps", s.steps},
      {"samples", s.samples},
      {"epochs", s.epochs},
      {"final_loss", s.final_loss},
      {"test_accuracy", optional_json(s.test_accuracy)},
      {"oom_recoveries", s.oom_recoveries},
      {"skipped_steps", s.skipped_steps},
      {"loss_scale", optional_json(s.loss_scale)},
      {"micro_batch_size", s.micro_batch_size},
      {"accumulation_steps", s.accumulation_steps},
      {"global_batch_size", s.global_batch_size},
      {"world_size", s.world_size},
      {"seconds", s.seconds},
      {"samples_per_s", s.samples_per_s},
      {"tokens_per_s", s.tokens > 0 ? nlohmann::json(s.tokens_per_s) : nlohmann::json(nullptr)},
      {"noise_scale", optional_json(s.noise_scale)},
      {"noise_scale_note", s.noise_scale_note.empty() ? nlohmann::json()
                                                      : nlohmann::json(s.noise_scale_note)},
      {"complete", s.complete},
      {"interrupted_by", s.interrupted_by.empty() ? nlohmann::json() : nlohmann::json(s.interrupted_by)},
      {"data_wait_fraction", s.data_wait_fraction},
  };
  if (s.tokens > 0) j["tokens"] = s.tokens;
  if (s.padded_tokens > 0) {
    j["padded_tokens"] = s.padded_tokens;
    j["padding_share"] = 1.0 - static_cast<double>(s.tokens) / static_cast<double>(s.padded_tokens);
    j["token_budget"] = s.token_budget > 0 ? nlohmann::json(s.token_budget) : nlohmann::json();
    j["target_tokens"] = s.target_tokens > 0 ? nlohmann::json(s.target_tokens) : nlohmann::json();
    j["micro_batches"] = s.micro_batches;
    // What one optimizer step held, on average: a token-budget step is
    // micro-batches of varying sample counts, so no "micro x accumulation".
    const auto per_step = [&](int64_t count) {
      return s.steps > 0 ? nlohmann::json(static_cast<double>(count) / static_cast<double>(s.steps))
                         : nlohmann::json();
    };
    j["tokens_per_step"] = per_step(s.tokens);
    j["samples_per_step"] = per_step(s.samples);
    j["micro_batches_per_step"] = per_step(s.micro_batches);
  }
  // --adapt: one entry per change of the global batch, the first the start.
  if (!s.batch_schedule.empty()) {
    j["batch_schedule"] = nlohmann::json::array();
    for (const auto& change : s.batch_schedule) j["batch_schedule"].push_back(to_json(change));
  }
  // Null without a target; the *_to_target fields null unless it was reached.
  j["target"] = s.target ? nlohmann::json{{"metric", s.target->metric},
                                          {"value", s.target->value},
                                          {"reached", s.target_reached}}
                         : nlohmann::json();
  // Null when the loss looked like training (see `LossWatch`).
  j["divergence"] = s.divergence ? nlohmann::json{{"step", s.divergence->step},
                                                  {"kind", divergence_kind_name(s.divergence->kind)},
                                                  {"note", s.divergence->note}}
                                 : nlohmann::json();
  j["steps_to_target"] = optional_json(s.steps_to_target);
  j["seconds_to_target"] = optional_json(s.seconds_to_target);
  j["samples_to_target"] = optional_json(s.samples_to_target);
  // Only on a resumed run: the step it went on from.
  if (s.resumed_from_step > 0) j["resumed_from_step"] = s.resumed_from_step;
  // Only when a time limit ended the run (the noise run of a tune).
  if (s.time_limit_reached) j["time_limit_reached"] = true;
  // Only on a re-emitted summary (--resume of a finished run).
  if (s.already_finished) j["already_finished"] = true;
  return j;
}

TrainSummary summary_from_json(const nlohmann::json& j) {
  TrainSummary s;
  s.steps = j.at("steps").get<int64_t>();
  s.samples = j.at("samples").get<int64_t>();
  s.epochs = j.at("epochs").get<double>();
  s.final_loss = j.at("final_loss").get<double>();
  s.test_accuracy = optional_field<double>(j, "test_accuracy");
  s.oom_recoveries = j.at("oom_recoveries").get<int64_t>();
  s.skipped_steps = j.at("skipped_steps").get<int64_t>();
  s.loss_scale = optional_field<double>(j, "loss_scale");
  s.micro_batch_size = j.at("micro_batch_size").get<int64_t>();
  s.accumulation_steps = j.at("accumulation_steps").get<int64_t>();
  s.global_batch_size = j.at("global_batch_size").get<int64_t>();
  s.world_size = j.at("world_size").get<int64_t>();
  s.seconds = j.at("seconds").get<double>();
  s.samples_per_s = j.at("samples_per_s").get<double>();
  s.tokens = optional_field<int64_t>(j, "tokens").value_or(0);
  s.tokens_per_s = optional_field<double>(j, "tokens_per_s").value_or(0);
  s.padded_tokens = optional_field<int64_t>(j, "padded_tokens").value_or(0);
  s.token_budget = optional_field<int64_t>(j, "token_budget").value_or(0);
  s.target_tokens = optional_field<int64_t>(j, "target_tokens").value_or(0);
  s.micro_batches = optional_field<int64_t>(j, "micro_batches").value_or(0);
  s.noise_scale = optional_field<double>(j, "noise_scale");
  s.noise_scale_note = optional_field<std::string>(j, "noise_scale_note").value_or("");
  s.complete = j.at("complete").get<bool>();
  s.interrupted_by = optional_field<std::string>(j, "interrupted_by").value_or("");
  s.data_wait_fraction = optional_field<double>(j, "data_wait_fraction").value_or(0);
  s.resumed_from_step = optional_field<int64_t>(j, "resumed_from_step").value_or(0);
  s.time_limit_reached = optional_field<bool>(j, "time_limit_reached").value_or(false);
  // Checkpoints written before targets existed have none of these; those
  // written before this writer had `target_reached` beside `target`.
  if (j.contains("target") && !j.at("target").is_null()) {
    const nlohmann::json& target = j.at("target");
    s.target = TrainTarget{target.at("metric").get<std::string>(), target.at("value").get<double>()};
    s.target_reached = target.contains("reached") ? target.at("reached").get<bool>()
                                                  : j.at("target_reached").get<bool>();
    s.steps_to_target = optional_field<int64_t>(j, "steps_to_target");
    s.seconds_to_target = optional_field<double>(j, "seconds_to_target");
    s.samples_to_target = optional_field<int64_t>(j, "samples_to_target");
  }
  // Checkpoints written before the loss was watched have none.
  if (j.contains("divergence") && !j.at("divergence").is_null()) {
    const nlohmann::json& d = j.at("divergence");
    s.divergence = Divergence{parse_divergence_kind(d.at("kind").get<std::string>()),
                              d.at("step").get<int64_t>(), d.at("note").get<std::string>()};
  }
  if (j.contains("batch_schedule")) {
    for (const auto& entry : j.at("batch_schedule")) {
      s.batch_schedule.push_back(batch_change_from_json(entry));
    }
  }
  return s;
}

}  // namespace batchtune
