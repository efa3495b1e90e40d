// Micro-batches of text by a token budget: length buckets, fixed batches,
// and a micro-batch split to fit a smaller budget.
#include "batchtune/data/token_batches.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "batchtune/common/error.h"

namespace batchtune {

LengthBucketSampler::LengthBucketSampler(std::vector<int64_t> lengths,
                                         std::vector<LengthBucket> buckets, int64_t token_budget,
                                         uint64_t seed)
    : lengths_(std::move(lengths)), buckets_(std::move(buckets)), token_budget_(token_budget),
      seed_(seed) {
  check_length_buckets(token_budget_, buckets_, "length buckets");
  for (int64_t l : lengths_) longest_ = std::max(longest_, l);
  if (longest_ > buckets_.back().max_length) {
    throw Error(fmt::format("length buckets: a sample of {} tokens is longer than the longest "
                            "bucket ({}); plan for the data's longest length",
                            longest_, buckets_.back().max_length));
  }
  set_token_budget(token_budget_);
}

void LengthBucketSampler::set_token_budget(int64_t token_budget) {
  if (token_budget < longest_) {
    throw Error(fmt::format("token budget: {} tokens cannot hold the longest sample ({} tokens)",
                            token_budget, longest_));
  }
  token_budget_ = token_budget;
}

std::vector<TokenBatch> LengthBucketSampler::epoch(int64_t epoch) const {
  std::vector<int64_t> order(lengths_.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed_ * 1000003 + static_cast<uint64_t>(epoch));
  std::shuffle(order.begin(), order.end(), rng);
  return batches(order);
}

std::vector<TokenBatch> LengthBucketSampler::batches(const std::vector<int64_t>& order) const {
  struct Open {
    TokenBatch batch;
    int64_t longest = 0;
  };
  std::vector<Open> open(buckets_.size());
  std::vector<TokenBatch> out;
  for (int64_t i : order) {
    const int64_t length = lengths_[static_cast<size_t>(i)];
    const auto bucket = static_cast<size_t>(
        std::lower_bound(buckets_.begin(), buckets_.end(), length,
                         [](const LengthBucket& b, int64_t l) { return b.max_length < l; }) -
        buckets_.begin());
    Open& o = open[bucket];
    const int64_t longest = std::max(o.longest, length);
    const auto count = static_cast<int64_t>(o.batch.indices.size()) + 1;
    if (!o.batch.indices.empty() && count * longest > token_budget_) {
      out.push_back(std::move(o.batch));
      o = Open();
    }
    o.longest = std::max(o.longest, length);
    o.batch.indices.push_back(i);
    o.batch.tokens += length;
    o.batch.padded_tokens = static_cast<int64_t>(o.batch.indices.size()) * o.longest;
  }
  for (auto& o : open) {
    if (!o.batch.indices.empty()) out.push_back(std::move(o.batch));
  }
  return out;
}

std::vector<LengthBucket> buckets_for_lengths(const std::vector<LengthBucket>& buckets,
                                              int64_t token_budget,
                                              const std::vector<int64_t>& lengths,
                                              int64_t parts) {
  check_length_buckets(token_budget, buckets, "length buckets");
  std::vector<int64_t> sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  std::vector<LengthBucket> out;
  size_t next = 0;  // the plan's first bucket not yet passed
  const auto add_until = [&](int64_t bound) {
    while (next < buckets.size() && buckets[next].max_length <= bound) {
      if (out.empty() || out.back().max_length < buckets[next].max_length) {
        out.push_back(buckets[next]);
      }
      ++next;
    }
  };
  for (int64_t k = 1; k < parts && !sorted.empty(); ++k) {
    const int64_t bound = sorted[static_cast<size_t>(
        (k * static_cast<int64_t>(sorted.size()) - 1) / parts)];
    add_until(bound);
    if (next == buckets.size() || (!out.empty() && out.back().max_length >= bound)) continue;
    const int64_t below = out.empty() ? buckets.front().micro_batch_size : out.back().micro_batch_size;
    out.push_back({bound, std::max<int64_t>(1, std::min(token_budget / bound, below))});
  }
  add_until(buckets.back().max_length);
  return out;
}

double mean_length(const std::vector<int64_t>& lengths) {
  if (lengths.empty()) return 0;
  const double sum = std::accumulate(lengths.begin(), lengths.end(), 0.0,
                                     [](double a, int64_t b) { return a + static_cast<double>(b); });
  return sum / static_cast<double>(lengths.size());
}

std::vector<int64_t> steps_by_tokens(const std::vector<TokenBatch>& batches, int64_t target_tokens,
                                     int64_t ranks) {
  if (target_tokens < 1) {
    throw Error(fmt::format("tokens_per_step: must be at least 1, got {}", target_tokens));
  }
  if (ranks < 1) throw Error(fmt::format("num_replicas: must be at least 1, got {}", ranks));
  const auto count = static_cast<int64_t>(batches.size());
  if (count % ranks != 0) {
    throw Error(fmt::format("steps_by_tokens: {} micro-batches are no whole number of rounds of {} "
                            "ranks",
                            count, ranks));
  }
  std::vector<int64_t> steps;
  int64_t rounds = 0;
  int64_t tokens = 0;
  for (int64_t round = 0; round < count / ranks; ++round) {
    for (int64_t r = 0; r < ranks; ++r) tokens += batches[static_cast<size_t>(round * ranks + r)].tokens;
    ++rounds;
    if (tokens >= target_tokens) {
      steps.push_back(rounds);
      rounds = 0;
      tokens = 0;
    }
  }
  if (rounds > 0) steps.push_back(rounds);
  return steps;
}

std::vector<TokenBatch> fixed_batches(const std::vector<int64_t>& lengths, int64_t batch_size,
                                      int64_t pad_to, uint64_t seed, int64_t epoch) {
  TORCH_CHECK(batch_size >= 1, "fixed_batches: a batch of at least 1");
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(epoch));
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<TokenBatch> out;
  for (size_t begin = 0; begin < order.size(); begin += static_cast<size_t>(batch_size)) {
    TokenBatch b;
    const size_t end = std::min(order.size(), begin + static_cast<size_t>(batch_size));
    b.indices.assign(order.begin() + static_cast<std::ptrdiff_t>(begin),
                     order.begin() + static_cast<std::ptrdiff_t>(end));
    for (int64_t i : b.indices) b.tokens += lengths[static_cast<size_t>(i)];
    b.padded_tokens = static_cast<int64_t>(b.indices.size()) * pad_to;
    out.push_back(std::move(b));
  }
  return out;
}

std::pair<TokenBatch, TokenBatch> split_in_halves(const TokenBatch& batch,
                                                  const std::vector<int64_t>& lengths) {
  std::vector<int64_t> sorted = batch.indices;
  // The shorter samples together, so that the halves pad less.
  std::sort(sorted.begin(), sorted.end(), [&](int64_t a, int64_t b) {
    return lengths[static_cast<size_t>(a)] < lengths[static_cast<size_t>(b)];
  });
  const auto half = static_cast<std::ptrdiff_t>(sorted.size() / 2);
  std::pair<TokenBatch, TokenBatch> out;
  out.first.indices.assign(sorted.begin(), sorted.begin() + half);
  out.second.indices.assign(sorted.begin() + half, sorted.end());
  for (TokenBatch* b : {&out.first, &out.second}) {
    int64_t longest = 0;
    for (int64_t i : b->indices) {
      b->tokens += lengths[static_cast<size_t>(i)];
      longest = std::max(longest, lengths[static_cast<size_t>(i)]);
    }
    b->padded_tokens = static_cast<int64_t>(b->indices.size()) * longest;
  }
  return out;
}

std::vector<TokenBatch> within_budget(const std::vector<TokenBatch>& batches, int64_t budget,
                                      const std::vector<int64_t>& lengths) {
  std::vector<TokenBatch> out;
  std::vector<TokenBatch> todo(batches.rbegin(), batches.rend());
  while (!todo.empty()) {
    TokenBatch b = std::move(todo.back());
    todo.pop_back();
    if (b.padded_tokens <= budget || b.indices.size() < 2) {
      out.push_back(std::move(b));
      continue;
    }
    auto [first, second] = split_in_halves(b, lengths);
    todo.push_back(std::move(second));
    todo.push_back(std::move(first));
  }
  return out;
}

}  // namespace batchtune
