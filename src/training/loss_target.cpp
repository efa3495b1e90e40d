#include "batchtune/training/loss_target.h"

#include <fmt/format.h>

#include <cmath>
#include <numeric>

namespace batchtune {

bool LossTarget::add(double loss) {
  window_.push_back(loss);
  if (static_cast<int64_t>(window_.size()) > window_size_) window_.pop_front();
  return static_cast<int64_t>(window_.size()) == window_size_ && mean() <= target_;
}

double LossTarget::mean() const {
  if (window_.empty()) return 0;
  return std::accumulate(window_.begin(), window_.end(), 0.0) /
         static_cast<double>(window_.size());
}

std::string format_loss(double loss) {
  if (loss != 0 && std::abs(loss) < 1e-3) return fmt::format("{:.3g}", loss);
  return fmt::format("{:.4f}", loss);
}

std::string LossTarget::reached_message(int64_t step, double seconds) const {
  return fmt::format(
      "mean loss {} over the last {} steps reached the target {} at step {} after {:.1f} "
      "s: stopping",
      format_loss(mean()), window_size_, format_loss(target_), step, seconds);
}

void LossTarget::restore(const std::vector<double>& losses) {
  window_.clear();
  for (double loss : losses) add(loss);
}

}  // namespace batchtune
