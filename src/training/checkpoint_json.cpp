#include "training/checkpoint_json.h"

namespace batchtune {

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

}  // namespace batchtune
