// What a checkpoint keeps of an `--adapt` run, shared by the image trainer
// and the token-budget run: the batch schedule, the policy, the noise
// estimate and the lr ramp (JSON `adapt`), and the gradient kept to measure
// the next step against.
#pragma once

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "batchtune/step/noise_scale.h"
#include "batchtune/step/successive_gradients.h"
#include "batchtune/training/batch_adapter.h"

namespace batchtune {

/// An `--adapt` run's state, by reference to where the run keeps it.
struct AdaptCheckpoint {
  std::vector<BatchChange>& schedule;
  BatchAdapter& adapter;
  NoiseScaleEstimator& noise;
  LrRamp& ramp;

  /// The JSON `adapt` of a checkpoint.
  nlohmann::json save() const;
  /// Reads `adapt` (of the checkpoint at `path`) back; throws an
  /// `OptionError` about `--resume` for one of another run or an unreadable
  /// one.
  void load(const nlohmann::json& adapt, const std::string& path);
};

/// The gradient a checkpoint kept (host tensors) onto `device`, counted as
/// the training's memory there.
SuccessiveGradients::State on_device(SuccessiveGradients::State state, c10::Device device);

}  // namespace batchtune
