#include "run_options.h"

namespace batchtune {

void check_train_options(const TrainOptions& options, bool has_test) {
  check_run_options(options);
  if (options.eval_every_samples() < 0) {
    throw OptionError(Option::kEvalEverySamples,
                      fmt::format("must be 0 (epoch ends only) or more, got {}",
                                  options.eval_every_samples()));
  }
  if (options.eval_every_samples() > 0 && options.eval_every() > 0) {
    throw OptionError(Option::kEvalEverySamples,
                      "give it or " + mention(Option::kEvalEvery) + ", not both");
  }
  if (options.eval_every() < 0) {
    throw OptionError(Option::kEvalEvery, fmt::format("must be 0 (epoch ends only) or more, got {}",
                                                      options.eval_every()));
  }
  if (const auto& target = options.target_accuracy()) {
    if (!(*target > 0 && *target <= 1)) {
      throw OptionError(Option::kTargetAccuracy,
                        fmt::format("must be a fraction in (0, 1], like 0.85; got {}", *target));
    }
    if (!has_test) {
      throw OptionError(Option::kTargetAccuracy,
                        "needs a test split to evaluate on (" + mention(Option::kData) +
                            " fashion-mnist, or an image folder with a test/ sub-folder)");
    }
  }
}

}  // namespace batchtune
