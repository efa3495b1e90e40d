#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace batchtune {

class Clock;
class Dataset;
class DeviceMemory;
class Workload;

/// What a short measuring run found.
struct NoiseScaleMeasurement {
  std::optional<double> noise_scale;  ///< B_simple; nullopt when not measured
  int64_t small_batch = 0;            ///< the micro-batch
  int64_t big_batch = 0;              ///< the logical batch
  int64_t steps = 0;                  ///< optimizer steps run
  int64_t measurements = 0;
  double seconds = 0;
  std::optional<double> gradient_sq_norm;
  std::optional<double> trace_covariance;
  std::string note;  ///< why it is missing, when it is
};

/// Optimizer steps of the measuring run of `tune --objective goodput`: a few
/// EMA windows, so that the first noisy measurements have faded.
constexpr int64_t kDefaultNoiseRunSteps = 60;
/// More steps than this is a typo: the run is a measurement, not training.
constexpr int64_t kMaxNoiseRunSteps = 100000;
/// Micro-batches per logical batch in the measuring run: the two batch sizes
/// differ by this factor, far enough apart that |G_small|² − |G_big|² is not
/// lost in rounding, near enough that the run stays short.
constexpr int64_t kNoiseRunAccumulation = 4;

/// Trains `workload` on `data` for `steps` optimizer steps with micro-batch
/// `micro_batch` × `kNoiseRunAccumulation` and the learning rate `lr`, and
/// reads the noise scale the loop measured. With `time_limit_s` > 0 it stops
/// after the step at which that much training time has passed on `clock`
/// (`steps` then says how many ran). The model, its optimizer state
/// and the random generator are put back afterwards (a tune leaves no
/// trace). Throws `batchtune::Error` when the data is too small.
NoiseScaleMeasurement measure_noise_scale(Workload& workload, DeviceMemory& memory,
                                          const Dataset& data, int64_t micro_batch, double lr,
                                          int64_t steps = kDefaultNoiseRunSteps,
                                          uint64_t seed = 0, double time_limit_s = 0,
                                          const Clock* clock = nullptr);

}  // namespace batchtune
