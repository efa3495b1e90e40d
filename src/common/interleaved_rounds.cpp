#include "batchtune/common/interleaved_rounds.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

namespace batchtune {

RoundsOutcome run_interleaved_rounds(size_t contenders,
                                     const std::function<RoundTrial(size_t, double)>& trial,
                                     const std::function<bool()>& settled,
                                     const RoundsOptions& options) {
  TORCH_CHECK(options.min_rounds >= 1 && options.max_rounds >= 1,
              "run_interleaved_rounds: need at least one round");
  const Clock& clock = options.clock != nullptr ? *options.clock : steady_clock();
  std::vector<bool> in(contenders, true);
  RoundsOutcome out;
  double longest_round_s = 0;
  while (out.rounds < options.max_rounds) {
    const auto playing = static_cast<int64_t>(std::count(in.begin(), in.end(), true));
    if (playing == 0) break;
    if (settled && settled()) break;
    const double round_start = clock.now_s();
    // The longest round so far is what the next is expected to take.
    if (out.rounds > 0 && round_start + longest_round_s > options.deadline_s) {
      out.out_of_time = true;
      break;
    }
    const int64_t rounds_left = std::max<int64_t>(1, options.min_rounds - out.rounds);
    ++out.rounds;
    int64_t left_in_round = playing;
    for (size_t i = 0; i < contenders && !out.stopped; ++i) {
      if (!in[i]) continue;
      const double trials_left =
          static_cast<double>(left_in_round-- + playing * (rounds_left - 1));
      const double slice = std::max(0.0, options.deadline_s - clock.now_s()) / trials_left;
      switch (trial(i, slice)) {
        case RoundTrial::kKeep: break;
        case RoundTrial::kDrop: in[i] = false; break;
        case RoundTrial::kStop: out.stopped = true; break;
      }
    }
    const double took = clock.now_s() - round_start;
    longest_round_s = std::max(longest_round_s, took);
    if (out.rounds == 1) {
      out.first_round_s = took;
      out.overrun_s = std::max(0.0, clock.now_s() - options.deadline_s);
    }
    if (out.stopped) break;
  }
  return out;
}

}  // namespace batchtune
