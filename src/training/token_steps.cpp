#include "token_steps.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>


namespace batchtune {
namespace {

nlohmann::json to_json(const TokenBatch& b) {
  return {{"indices", b.indices}, {"tokens", b.tokens}, {"padded_tokens", b.padded_tokens}};
}

TokenBatch token_batch_from_json(const nlohmann::json& j) {
  TokenBatch b;
  b.indices = j.at("indices").get<std::vector<int64_t>>();
  b.tokens = j.at("tokens").get<int64_t>();
  b.padded_tokens = j.at("padded_tokens").get<int64_t>();
  return b;
}

}  // namespace

TokenSteps::TokenSteps(const TextDataset& data, const Plan& plan,
                       const TokenTrainOptions& options)
    : data_(data),
      lengths_(data.lengths()),
      seed_(options.run().seed()),
      fixed_batch_size_(options.fixed_batch_size()),
      fixed_(options.fixed_batch_size() > 0),
      longest_(data.length_range().max) {
  pad_to_ = fixed_ ? std::max(options.pad_to(), longest_) : 0;
  cap_ = fixed_ ? fixed_batch_size_ * pad_to_ : plan.token_budget;
  // Fixed batches without a token target: the plan's micro-batches per step
  // (one for --batch-size), never more on account of their padding.
  group_size_ =
      fixed_ && options.target_tokens() == 0 ? std::max<int64_t>(1, plan.accumulation_steps) : 0;
  target_tokens_ =
      options.target_tokens() > 0 ? options.target_tokens() : group_size_ > 0 ? 0 : cap_;
  budget_ = fixed_ ? cap_ : budget_for(target_tokens_);
  if (!fixed_) {
    // The plan's buckets are checked against the plan's budget; micro-batches
    // are then filled to the step's.
    sampler_.emplace(lengths_, plan.length_buckets, cap_, seed_);
    sampler_->set_token_budget(budget_);
  }
}

void TokenSteps::start_epoch(int64_t epoch) {
  if (resumed_rest_) {
    micro_ = std::move(*resumed_rest_);
    resumed_rest_.reset();
  } else {
    micro_ = fixed_ ? fixed_batches(lengths_, fixed_batch_size_, pad_to_, seed_, epoch)
                    : sampler_->epoch(epoch);
  }
  next_ = 0;
}

std::vector<TokenBatch> TokenSteps::next_group(bool split_single) {
  std::vector<TokenBatch> group;
  int64_t group_tokens = 0;
  while (next_ < micro_.size() &&
         (group_size_ > 0 ? static_cast<int64_t>(group.size()) < group_size_
                          : group_tokens < target_tokens_)) {
    group_tokens += micro_[next_].tokens;
    group.push_back(micro_[next_++]);
  }
  if (split_single && !fixed_ && group.size() == 1 && group.front().indices.size() >= 2) {
    auto [first, second] = split_in_halves(group.front(), lengths_);
    group = {std::move(first), std::move(second)};
  }
  return group;
}

std::vector<Batch> TokenSteps::batches(std::vector<TokenBatch>& group) const {
  if (!fixed_) group = within_budget(group, budget_, lengths_);
  std::vector<Batch> batches;
  for (const auto& b : group) {
    batches.push_back(data_.get_batch(b.indices));
    if (fixed_) {
      // Padded to the longest sequence, as a fixed batch is.
      Batch& last = batches.back();
      const int64_t have = last.inputs[0].size(1);
      if (have < pad_to_) {
        last.inputs[0] = at::constant_pad_nd(last.inputs[0], {0, pad_to_ - have}, 0);
        last.target = at::constant_pad_nd(last.target, {0, pad_to_ - have}, kIgnoreTarget);
      }
    }
  }
  return batches;
}

bool TokenSteps::halve_budget() {
  if (fixed_ || budget_ <= longest_) return false;
  cap_ = std::max(longest_, budget_ / 2);
  budget_ = cap_;
  sampler_->set_token_budget(budget_);
  return true;
}

void TokenSteps::set_target_tokens(int64_t target) {
  target_tokens_ = target;
  budget_ = budget_for(target_tokens_);
  sampler_->set_token_budget(budget_);
  std::vector<int64_t> rest;
  for (size_t i = next_; i < micro_.size(); ++i) {
    rest.insert(rest.end(), micro_[i].indices.begin(), micro_[i].indices.end());
  }
  micro_.resize(next_);
  for (TokenBatch& b : sampler_->batches(rest)) micro_.push_back(std::move(b));
}

void TokenSteps::save(nlohmann::json& tokens) const {
  nlohmann::json rest = nlohmann::json::array();
  for (size_t i = next_; i < micro_.size(); ++i) rest.push_back(to_json(micro_[i]));
  tokens["target_tokens"] = target_tokens_;
  tokens["token_budget"] = budget_;
  tokens["token_cap"] = cap_;
  tokens["rest_of_epoch"] = std::move(rest);
}

void TokenSteps::load(const nlohmann::json& tokens) {
  std::vector<TokenBatch> rest;
  for (const auto& b : tokens.at("rest_of_epoch")) rest.push_back(token_batch_from_json(b));
  target_tokens_ = tokens.at("target_tokens").get<int64_t>();
  budget_ = tokens.at("token_budget").get<int64_t>();
  cap_ = tokens.at("token_cap").get<int64_t>();
  resumed_rest_ = std::move(rest);
  if (sampler_) sampler_->set_token_budget(budget_);
}

}  // namespace batchtune
