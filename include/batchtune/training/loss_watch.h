#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "batchtune/plan/plan.h"

namespace batchtune {

/// What a run's loss said about its lr: not finite at a step, or flat from
/// its start. JSON `divergence` of the train summary.
struct Divergence {
  enum class Kind {
    kNotFinite,  ///< the loss was NaN or infinite ("not_finite")
    kFlat,       ///< the smoothed loss did not fall from its start ("flat")
  };
  Kind kind = Kind::kNotFinite;
  int64_t step = 0;  ///< optimizer steps done when it was seen
  /// One line: what was seen, the likely cause (the lr, its scaling, the
  /// warm-up) and what to change.
  std::string note;
};

/// "not_finite" or "flat": the JSON spelling of `kind`.
const char* divergence_kind_name(Divergence::Kind kind);
/// `divergence_kind_name` read back; throws `std::invalid_argument` for another word.
Divergence::Kind parse_divergence_kind(const std::string& name);

/// The one rule for a run whose loss says its lr is wrong, for images and
/// text alike (the trainer feeds it): the loss is not finite at a step, or
/// it is flat — the mean of the last `kLossSmoothSteps` steps has not fallen
/// `kFlatFall` below the mean of the run's first `kLossSmoothSteps` by the
/// end of the flat window (`flat_window_steps`). Each kind is said once; a
/// loss once not finite is not judged flat, and the watch stays "not finite"
/// (`finite()` false: `--adapt` decides no more on it). The flat window is
/// judged once, at its end, from the run's step 0: a resumed run (which
/// starts mid-way, where a plateau is no fault) judges only finiteness.
///
/// Example:
/// ```
///   batchtune::LossWatch watch(plan, /*adapting=*/false, /*from_start=*/true);
///   if (auto d = watch.observe(10, loss_sum_of_ten_steps, 10)) std::cout << d->note;
/// ```
class LossWatch {
 public:
  /// `plan`: the run's start, whose lr, scaling and warm-up the notes name;
  /// `adapting`: a non-finite note adds that `--adapt` stops deciding;
  /// `from_start`: the run starts at step 0 (not a resume), so the flat
  /// window is judged.
  LossWatch(const Plan& plan, bool adapting, bool from_start);

  /// Adds `steps` optimizer steps whose losses sum to `loss_sum`, the last
  /// of them step `step` (steps done); returns the divergence first seen
  /// now, or nullopt.
  std::optional<Divergence> observe(int64_t step, double loss_sum, int64_t steps);
  /// False once a loss was not finite.
  bool finite() const { return finite_; }
  /// The latest divergence said (a non-finite loss after a flat start
  /// replaces it); nullopt when none.
  const std::optional<Divergence>& divergence() const { return divergence_; }
  /// Steps after which the flat window is judged: `kFlatWindowSteps`, or
  /// twice the warm-up when that is longer.
  int64_t flat_window_steps() const { return flat_window_; }

 private:
  std::string cause() const;
  std::optional<Divergence> judge_flat(int64_t step);

  const Plan plan_;
  const bool adapting_;
  const int64_t flat_window_;
  bool judge_flat_;
  bool finite_ = true;
  /// The mean of the run's first steps, once `kLossSmoothSteps` are in.
  double start_sum_ = 0;
  int64_t start_steps_ = 0;
  /// The latest chunks (loss sum, steps), covering at least `kLossSmoothSteps`.
  std::deque<std::pair<double, int64_t>> recent_;
  int64_t recent_steps_ = 0;
  std::optional<Divergence> divergence_;
};

/// Steps the start and the latest loss are each the mean of: one batch's
/// loss varies too much to compare two steps.
constexpr int64_t kLossSmoothSteps = 10;
/// The flat window: long enough for any lr that trains to move the loss
/// (a converging run falls by far more than `kFlatFall` in it), short
/// enough to say so in a one-epoch run (117 steps of fashion-mnist at 512).
constexpr int64_t kFlatWindowSteps = 100;
/// The fall below which the loss is flat: 1 % of its start, which a net
/// that learns passes many times over in the window.
constexpr double kFlatFall = 0.01;
/// The trainer reads the loss for the watch every this many steps (and
/// before each `--adapt` decision): a wait for the device each time.
constexpr int64_t kLossWatchEvery = 10;

}  // namespace batchtune
