#pragma once

// `--target-loss`, for every run (images and text): the moving mean of the
// last optimizer steps' training losses, and whether it has reached the target.

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace batchtune {

/// A loss or a loss target as the run's lines show it: four decimals
/// ("1.5000"), or three significant digits below 0.001 ("1e-06"), where four
/// decimals would print a target of 1e-6 as 0.0000.
std::string format_loss(double loss);

/// Stops a run once the mean loss of its last `window` optimizer steps is at
/// or below `target`: a mean of a few, so that one lucky batch does not end
/// the run. The window is a checkpoint's, so that a resume stops where the
/// whole run would have.
class LossTarget {
 public:
  LossTarget(double target, int64_t window) : target_(target), window_size_(window) {}

  /// Adds the loss of the step just trained; true when the window is full
  /// and its mean is at or below the target.
  bool add(double loss);
  /// The mean over the window as it stands (0 when empty), summed afresh:
  /// a resumed window gives the very mean the whole run's did.
  double mean() const;
  double target() const { return target_; }
  /// The line that says the run stops: the mean, the window, the target,
  /// where (`step`) and when (`seconds` of training).
  std::string reached_message(int64_t step, double seconds) const;
  int64_t window_size() const { return window_size_; }

  /// The losses in the window, oldest first (a checkpoint's `loss_window`).
  std::vector<double> window() const { return {window_.begin(), window_.end()}; }
  /// Continues from a checkpoint's window (its last `window_size` losses).
  void restore(const std::vector<double>& losses);

 private:
  const double target_;
  const int64_t window_size_;
  std::deque<double> window_;
};

}  // namespace batchtune
