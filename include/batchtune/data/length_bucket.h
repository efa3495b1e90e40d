#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace batchtune {

/// One length bucket of a token-budget plan: sequences of up to
/// `max_length` tokens (longer than the bucket before), `micro_batch_size`
/// of them per micro-batch at that length.
struct LengthBucket {
  int64_t max_length = 0;
  int64_t micro_batch_size = 0;
};

/// Checks a token budget and its buckets: a budget of at least 1, at least
/// one bucket, bounds strictly rising, each micro-batch at least 1 and its
/// padded tokens (micro-batch × bound) within the budget. Throws
/// `batchtune::Error` as "`source`: field `length_buckets`: what is wrong".
void check_length_buckets(int64_t token_budget, const std::vector<LengthBucket>& buckets,
                          const std::string& source);

}  // namespace batchtune
