#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

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
  std::string note;  ///< why it is missing, when it is (see `read_noise_scale`)
  /// The micro-batches measured at, in order: more than one where an
  /// unresolved estimate was measured again at a larger batch (see
  /// `measure_noise_until_resolved`).
  std::vector<int64_t> micro_batches_tried;
  /// Measured, but the signal could not be told from its noise.
  bool unresolved() const { return !noise_scale && measurements > 0; }
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

/// An unresolved estimate is measured again at this many times the
/// micro-batch: the spread of |G_small|² − |G_big|² falls as the batches
/// grow, while |G|² does not.
constexpr int64_t kNoiseRunGrowth = 2;
/// ... when at least this share of the run it expects (the last run's time
/// × `kNoiseRunGrowth`) is left of the share: a run cut much shorter would
/// measure too few steps to resolve what a whole one could not.
constexpr double kNoiseRunMinExpectedShare = 0.5;

/// One measuring run at `micro_batch` that stops after `seconds` (for a
/// workload, `measure_noise_scale` on its data and lr).
using NoiseRun = std::function<NoiseScaleMeasurement(int64_t micro_batch, double seconds)>;

/// The goodput objective's noise run within its share: a run at
/// `micro_batch`, then, while the estimate is unresolved and what is left
/// until `deadline_s` on `clock` allows, again at `kNoiseRunGrowth` times
/// the micro-batch, up to `max_micro_batch` (the largest that fits). Each
/// run gets what is left. Returns the last run's measurement, its
/// `micro_batches_tried` and `seconds` over all runs; an estimate still
/// unresolved has a note that says where it was tried and what was left.
NoiseScaleMeasurement measure_noise_until_resolved(const NoiseRun& run, int64_t micro_batch,
                                                   int64_t max_micro_batch, double deadline_s,
                                                   const Clock& clock);

}  // namespace batchtune
