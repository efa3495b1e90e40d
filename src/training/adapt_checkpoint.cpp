#include "adapt_checkpoint.h"

#include <fmt/format.h>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"

namespace batchtune {

nlohmann::json AdaptCheckpoint::save() const {
  nlohmann::json changes = nlohmann::json::array();
  for (const auto& change : schedule) changes.push_back(to_json(change));
  return {{"batch_schedule", changes},
          {"policy", adapter.state()},
          {"noise", noise.state()},
          {"lr_ramp_from", ramp.from},
          {"lr_ramp_start", ramp.start}};
}

void AdaptCheckpoint::load(const nlohmann::json& adapt, const std::string& path) {
  try {
    std::vector<BatchChange> changes;
    for (const auto& entry : adapt.at("batch_schedule")) {
      changes.push_back(batch_change_from_json(entry));
    }
    adapter.load_state(adapt.at("policy"));
    noise.load_state(adapt.at("noise"));
    ramp.from = adapt.at("lr_ramp_from").get<double>();
    ramp.start = adapt.at("lr_ramp_start").get<int64_t>();
    schedule = std::move(changes);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw OptionError(Option::kResume,
                      fmt::format("{} has an unreadable {} state ({}); start afresh in another "
                                  "{} directory",
                                  path, mention(Option::kAdapt), first_line(e.what()),
                                  mention(Option::kCheckpoint)));
  }
}

SuccessiveGradients::State on_device(SuccessiveGradients::State state, c10::Device device) {
  const auto move = [&](at::Tensor& t) {
    if (t.defined()) t = t.to(device).clone();
  };
  for (SuccessiveGradients::Kept* kept : {&state.previous, &state.earlier}) {
    for (at::Tensor& t : kept->gradient) move(t);
    move(kept->sq_norm);
    move(kept->loss_scale);
  }
  move(state.cross);
  return state;
}

}  // namespace batchtune
