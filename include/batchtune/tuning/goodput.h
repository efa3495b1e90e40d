#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "batchtune/step/noise_scale.h"  // statistical_efficiency
#include "batchtune/tuning/sweep.h"

namespace batchtune {

/// Accumulation steps a goodput candidate may use at most: past 64
/// micro-batches per step the statistical efficiency of so large a batch has
/// fallen far below what any throughput gain could make up.
constexpr int64_t kGoodputMaxAccumulation = 64;

/// One way to train at a global batch, and what it is worth.
struct GoodputCandidate {
  int64_t global_batch_size = 0;
  int64_t micro_batch_size = 0;    ///< a sweep row's batch that divides the global batch
  int64_t accumulation_steps = 0;  ///< global / micro
  double samples_per_s = 0;        ///< the micro-batch's throughput
  double efficiency = 0;           ///< E(global)
  double goodput = 0;              ///< samples_per_s × efficiency
  /// Why the micro-batch is the largest dividing row though a smaller one
  /// measured faster (the rows could not tell them apart); empty otherwise.
  std::string micro_note;
};

/// The candidate global batches and their goodput: every sweep row's batch,
/// every power of two, and `base_batch` itself, from `base_batch` up to the
/// largest row × `kGoodputMaxAccumulation` (and at most `max_global_batch`
/// when positive: the training data). Each runs as the largest sweep row
/// whose batch divides it, accumulated (at most `kGoodputMaxAccumulation`
/// micro-batches), unless a smaller dividing row is measured clearly faster
/// (neither row noisy, their intervals apart): for one global batch a larger
/// micro-batch is not slower unless measured so, and a burst of load on one
/// row must not make a plan of micro-batch 1 x 64. Sorted by global batch. Rows must not
/// be empty; `noise_scale` ≥ 0.
std::vector<GoodputCandidate> goodput_candidates(const std::vector<SweepRow>& rows,
                                                 double noise_scale, int64_t base_batch,
                                                 int64_t max_global_batch = 0);

/// The chosen candidate and why, in plain words with the numbers.
struct GoodputChoice {
  GoodputCandidate chosen;
  std::string reason;
};

/// The candidate of the highest goodput (the smaller global batch on a tie).
/// `candidates` must not be empty.
GoodputChoice select_goodput(const std::vector<GoodputCandidate>& candidates, double noise_scale,
                             int64_t base_batch);

}  // namespace batchtune
