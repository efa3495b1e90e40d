#include "batchtune/data/length_bucket.h"

#include <fmt/format.h>

#include "batchtune/common/counts.h"
#include "batchtune/common/error.h"

namespace batchtune {

void check_length_buckets(int64_t token_budget, const std::vector<LengthBucket>& buckets,
                          const std::string& source) {
  const auto fail = [&](const char* field, const std::string& what) {
    throw Error(fmt::format("{}: field '{}': {}", source, field, what));
  };
  if (token_budget < 1 || token_budget > kMaxPlanCount) {
    fail("token_budget", fmt::format("must be from 1 to {} tokens, got {}", kMaxPlanCount,
                                     token_budget));
  }
  if (buckets.empty()) fail("length_buckets", "a token budget needs at least one length bucket");
  int64_t previous = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    const LengthBucket& b = buckets[i];
    if (b.max_length <= previous) {
      fail("length_buckets",
           fmt::format("bucket {}: max_length must be at least 1 and above the bucket before's "
                       "({}), got {}",
                       i, previous, b.max_length));
    }
    if (b.micro_batch_size < 1) {
      fail("length_buckets", fmt::format("bucket {}: micro_batch_size must be at least 1, got {}",
                                         i, b.micro_batch_size));
    }
    const auto tokens = checked_product(b.micro_batch_size, b.max_length);
    if (!tokens || *tokens > token_budget) {
      fail("length_buckets",
           fmt::format("bucket {}: {} samples of {} tokens pass the token_budget {}", i,
                       b.micro_batch_size, b.max_length, token_budget));
    }
    previous = b.max_length;
  }
}

}  // namespace batchtune
