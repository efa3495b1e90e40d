#include "token_steps.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "batchtune/common/counts.h"
#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/common/size.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/training_step.h"
#include "batchtune/training/checkpoint.h"
#include "training/checkpoint_fields.h"

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

TokenSteps::TokenSteps(const TextDataset& data, Plan& plan, const TokenTrainOptions& options,
                       const DeviceMemory& memory)
    : data_(data),
      lengths_(data.lengths()),
      plan_(plan),
      start_plan_(plan),
      options_(options),
      memory_(memory),
      fixed_batch_size_(options.fixed_batch_size()),
      fixed_(options.fixed_batch_size() > 0),
      longest_(data.length_range().max) {
  const TrainOptions& run = options.run();
  if (!fixed_ && plan.token_budget < 1) {
    throw OptionError(Option::kPlan, "training by tokens needs a plan with a token_budget (tune "
                                     "with " + mention(Option::kInput) + " int64:MIN..MAX)");
  }
  // Text has no test split: what only evaluation reads is refused here.
  if (run.eval_every() > 0 || run.eval_every_samples() > 0) {
    throw OptionError(run.eval_every() > 0 ? Option::kEvalEvery : Option::kEvalEverySamples,
                      "text has no test split to evaluate; stop at a training loss with " +
                          mention(Option::kTargetLoss));
  }
  if (options.target_tokens() < 0) {
    throw OptionError(Option::kTargetTokens,
                      fmt::format("must be at least 1, got {}", options.target_tokens()));
  }
  if (run.adapt() && fixed_) {
    throw OptionError(Option::kAdapt, "moves the tokens per step of a token budget; leave out " +
                                          mention(Option::kBatchSize));
  }
  pad_to_ = fixed_ ? std::max(options.pad_to(), longest_) : 0;
  cap_ = fixed_ ? fixed_batch_size_ * pad_to_ : plan.token_budget;
  // Fixed batches without a token target: the plan's micro-batches per step
  // (one for --batch-size), never more on account of their padding.
  group_size_ =
      fixed_ && options.target_tokens() == 0 ? std::max<int64_t>(1, plan.accumulation_steps) : 0;
  target_tokens_ = options.target_tokens() > 0 ? options.target_tokens()
                   : group_size_ > 0           ? 0
                   : plan.tokens_per_step > 0  ? plan.tokens_per_step
                                               : cap_;
  budget_ = fixed_ ? cap_ : budget_for(target_tokens_);
  if (!fixed_) {
    // The plan's buckets are checked against the plan's budget; micro-batches
    // are then filled to the step's.
    // The plan's buckets cut at the data's own length quantiles, as
    // Python's TokenBudgetSampler cuts them: a micro-batch pads little.
    sampler_.emplace(lengths_, buckets_for_lengths(plan.length_buckets, cap_, lengths_), cap_,
                     run.seed());
    sampler_->set_token_budget(budget_);
  }
  if (run.adapt()) adapt_options();  // its limit checked before the first step
}

AdaptOptions TokenSteps::adapt_options() const {
  AdaptOptions adapt = options_.run().adapt_options();
  adapt.unit("tokens");
  int64_t data_tokens = 0;
  for (int64_t l : lengths_) data_tokens += l;
  if (adapt.max_global_batch() > data_tokens) {
    throw OptionError(Option::kAdaptMaxBatch,
                      fmt::format("{} tokens is more than the data's {}; give at most that",
                                  adapt.max_global_batch(), data_tokens));
  }
  if (adapt.max_global_batch() == 0) {
    const int64_t start = options_.target_tokens() > 0     ? options_.target_tokens()
                          : start_plan_.tokens_per_step > 0 ? start_plan_.tokens_per_step
                                                            : cap_;
    adapt.max_global_batch(std::max(
        start, std::min(checked_product(start, kDefaultAdaptGrowth).value_or(data_tokens),
                        data_tokens)));
  }
  return adapt;
}

bool TokenSteps::epochs_done(int64_t /*step*/, int64_t epochs) const {
  return started_ && epoch_done() && epoch_ + 1 >= epochs;
}

double TokenSteps::epochs_at(int64_t /*step*/) const {
  // Whole epochs, and the share of the one under way.
  if (lengths_.empty()) return static_cast<double>(epoch_ + 1);
  return static_cast<double>(epoch_) +
         static_cast<double>(epoch_samples_) / static_cast<double>(lengths_.size());
}

std::string TokenSteps::position_in_epoch(int64_t /*step*/) const {
  // At an epoch's end, the next one starts at the next step.
  if (started_ && epoch_done()) return "at its start";
  return fmt::format("micro-batch {} of it", epoch_offset_ + static_cast<int64_t>(next_));
}

void TokenSteps::start(int64_t /*step*/, const Clock& /*clock*/) {
  start_tokens_ = tokens_;
  if (!started_) start_epoch(0);  // a resume continues the epoch it stopped in
}

void TokenSteps::start_epoch(int64_t epoch) {
  epoch_ = epoch;
  micro_ = fixed_ ? fixed_batches(lengths_, fixed_batch_size_, pad_to_, options_.run().seed(), epoch)
                  : sampler_->epoch(epoch);
  next_ = 0;
  epoch_offset_ = 0;
  epoch_samples_ = 0;
  started_ = true;
}

void TokenSteps::next(int64_t /*step*/, bool split_for_noise, double& /*data_seconds*/) {
  if (epoch_done()) start_epoch(epoch_ + 1);
  group_ = next_group(split_for_noise);
  group_tokens_ = 0;
  group_samples_ = 0;
  for (const auto& b : group_) {
    group_tokens_ += b.tokens;
    group_samples_ += static_cast<int64_t>(b.indices.size());
  }
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

std::vector<Batch> TokenSteps::group_batches() {
  if (!fixed_) group_ = within_budget(group_, budget_, lengths_);
  std::vector<Batch> batches;
  for (const auto& b : group_) {
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

at::Tensor TokenSteps::backward(TrainingStep& step, int64_t /*step_index*/,
                                double& /*data_seconds*/) {
  const std::vector<Batch> batches = group_batches();
  // Each micro-batch's loss weighted by its share of the step's real tokens;
  // the noise scale measured in tokens, the first micro-batch against the
  // step (or a step of one against the previous one).
  std::vector<double> weights;
  std::vector<int64_t> noise_sizes;
  for (const auto& b : group_) {
    weights.push_back(static_cast<double>(b.tokens) / static_cast<double>(group_tokens_));
    noise_sizes.push_back(b.tokens);
  }
  if (!step.options().measure_noise_scale() ||
      (group_.size() < 2 && !step.options().noise_from_successive_steps())) {
    noise_sizes.clear();
  }
  at::Tensor loss = step.backward_weighted(batches, weights, noise_sizes);
  // The step fitted: its counts.
  micro_batches_ += static_cast<int64_t>(group_.size());
  epoch_samples_ += group_samples_;
  for (const auto& b : group_) {
    tokens_ += b.tokens;
    padded_tokens_ += padded_tokens(b);
  }
  return loss;
}

std::string TokenSteps::shrink(const std::string& why, int64_t step_index,
                               TrainingStep& /*step*/) {
  // Half the budget, never below the longest sample: the same samples and
  // tokens in micro-batches half as large; later micro-batches follow it.
  const int64_t before = budget_;
  if (fixed_ || budget_ <= longest_) {
    throw Error(fmt::format(
        "train: out of memory at {} (step {}): {}; not even one sample of {} tokens fits in {}",
        fixed_ ? fmt::format("fixed batches of {}", fixed_batch_size_)
               : fmt::format("a token budget of {}", before),
        step_index + 1, why, longest_, format_bytes(memory_.usable_bytes())));
  }
  cap_ = std::max(longest_, budget_ / 2);
  budget_ = cap_;
  sampler_->set_token_budget(budget_);
  return fmt::format(
      "out of memory at a token budget of {} (step {}); retrying the same {} tokens with a "
      "budget of {}",
      before, step_index + 1, group_tokens_, budget_);
}

BatchChange TokenSteps::start_change() const {
  BatchChange start;
  start.global_batch_size = target_tokens_;
  start.micro_batch_size = budget_;
  start.accumulation_steps = ceil_div(target_tokens_, budget_);
  start.reason = "the real tokens per step and lr the run starts from, where adapting starts";
  return start;
}

std::string TokenSteps::resize(BatchChange& change, TrainingStep& /*step*/) {
  // The rest of the epoch, the same samples in the same order, cut anew
  // into micro-batches of the new budget.
  const int64_t before = target_tokens_;
  target_tokens_ = change.global_batch_size;
  budget_ = budget_for(target_tokens_);
  sampler_->set_token_budget(budget_);
  std::vector<int64_t> rest;
  for (size_t i = next_; i < micro_.size(); ++i) {
    rest.insert(rest.end(), micro_[i].indices.begin(), micro_[i].indices.end());
  }
  micro_.resize(next_);
  for (TokenBatch& b : sampler_->batches(rest)) micro_.push_back(std::move(b));
  change.micro_batch_size = budget_;
  change.accumulation_steps = ceil_div(target_tokens_, budget_);
  return fmt::format("adapt: {} -> {} real tokens per step (micro-batches of {} padded tokens)",
                     before, target_tokens_, budget_);
}

void TokenSteps::identify(RunIdentity& id) const {
  id.world_size = 1;
  // Fixed batches: their samples; a token budget: the plan's tokens.
  id.global_batch_size = fixed_ ? fixed_batch_size_ : start_plan_.token_budget;
  id.train_size = static_cast<int64_t>(lengths_.size());
}

void TokenSteps::save(CheckpointRecord& record) const {
  // The token counts, and the tokens per step, the budget and the rest of
  // the epoch, so that a resume trains the same steps on.
  nlohmann::json rest = nlohmann::json::array();
  for (size_t i = next_; i < micro_.size(); ++i) rest.push_back(to_json(micro_[i]));
  record.position.batch_in_epoch = epoch_offset_ + static_cast<int64_t>(next_);
  record.tokens = nlohmann::json{{"target_tokens_given", options_.target_tokens()},
                                 {"data_crc32", data_.digest()},
                                 {"epoch", epoch_},
                                 {"lr", plan_.lr},
                                 {"tokens", tokens_},
                                 {"padded_tokens", padded_tokens_},
                                 {"micro_batches", micro_batches_},
                                 {"epoch_samples", epoch_samples_},
                                 {"target_tokens", target_tokens_},
                                 {"token_budget", budget_},
                                 {"token_cap", cap_},
                                 {"rest_of_epoch", std::move(rest)}};
}

void TokenSteps::check(const CheckpointRecord& record, const std::string& path) const {
  if (!record.tokens) {
    throw OptionError(Option::kResume,
                      fmt::format("{} was written by a run on images, not text by a token "
                                  "budget; give another {} DIR to start afresh",
                                  path, mention(Option::kCheckpoint)));
  }
  // The text by its content: words edited with the paragraph count kept
  // (which the identity compares) are another data set. A checkpoint
  // written before the digest was kept is compared by that count alone.
  if (record.tokens->contains("data_crc32")) {
    const auto saved = static_cast<uint32_t>(CheckpointFields(path).count(
        *record.tokens, "data_crc32", "tokens.data_crc32", 0, int64_t{UINT32_MAX}));
    if (saved != data_.digest()) {
      throw OptionError(
          Option::kResume,
          fmt::format("{} was written on other text than text:{} holds now (the same {} "
                      "paragraphs, other bytes: CRC-32 {:08x} then, {:08x} now); resume with "
                      "the text as it was, or give another {} DIR to start afresh",
                      path, data_.dir(), lengths_.size(), saved, data_.digest(),
                      mention(Option::kCheckpoint)));
    }
  }
  const auto given = record.tokens->find("target_tokens_given");
  if (given != record.tokens->end() && given->is_number_integer() &&
      given->get<int64_t>() != options_.target_tokens()) {
    // 0 is "not given", never a count (it said "this one has 0").
    const int64_t was = given->get<int64_t>();
    const std::string flag = mention(Option::kTargetTokens);
    throw OptionError(
        Option::kResume,
        fmt::format("{} was written by a run {}, this one {}; resume {}", path,
                    was > 0 ? fmt::format("with {} {}", flag, was) : "without " + flag,
                    options_.target_tokens() > 0
                        ? fmt::format("has {}", options_.target_tokens())
                        : "gives none",
                    was > 0 ? fmt::format("with the same {}", flag) : "without " + flag));
  }
}

void TokenSteps::load(const CheckpointRecord& record, const std::vector<BatchChange>& /*schedule*/,
                      const std::string& path) {
  const nlohmann::json& t = *record.tokens;
  check_token_fields(t, path, static_cast<int64_t>(lengths_.size()), group_size_ > 0);
  try {
    std::vector<TokenBatch> rest;
    for (const auto& b : t.at("rest_of_epoch")) rest.push_back(token_batch_from_json(b));
    target_tokens_ = t.at("target_tokens").get<int64_t>();
    budget_ = t.at("token_budget").get<int64_t>();
    cap_ = t.at("token_cap").get<int64_t>();
    if (sampler_) sampler_->set_token_budget(budget_);
    tokens_ = t.at("tokens").get<int64_t>();
    padded_tokens_ = t.at("padded_tokens").get<int64_t>();
    micro_batches_ = t.at("micro_batches").get<int64_t>();
    epoch_samples_ = t.at("epoch_samples").get<int64_t>();
    plan_.lr = t.at("lr").get<double>();
    // The epoch it stopped in continues with the micro-batches it had left;
    // at an epoch's end (none left) the next step starts the next epoch, as
    // the whole run's did. The trainer's position already counts that next
    // epoch: a checkpoint without "epoch" is one behind it there (taking
    // the position skipped the whole next epoch).
    epoch_ = t.contains("epoch") ? t.at("epoch").get<int64_t>()
             : rest.empty() && record.position.epoch > 0 ? record.position.epoch - 1
                                                         : record.position.epoch;
    micro_ = std::move(rest);
    next_ = 0;
    epoch_offset_ = record.position.batch_in_epoch;
    started_ = true;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw OptionError(Option::kResume,
                      fmt::format("{} has an unreadable token state ({}); give another {} DIR to "
                                  "start afresh",
                                  path, first_line(e.what()), mention(Option::kCheckpoint)));
  }
}

void TokenSteps::describe(TrainEvent& event, double train_seconds) const {
  // The step's micro-batches, and the largest in padded tokens.
  event.accumulation_steps = static_cast<int64_t>(group_.size());
  event.micro_batch_size = 0;
  for (const auto& b : group_) {
    event.micro_batch_size = std::max(event.micro_batch_size, padded_tokens(b));
  }
  event.message = fmt::format(
      "{:.0f} tokens/s, token budget {}",
      train_seconds > 0 ? static_cast<double>(tokens_ - start_tokens_) / train_seconds : 0,
      budget_);
}

void TokenSteps::summarize(TrainSummary& s, double seconds) const {
  s.epochs = epochs_at(s.steps);
  s.tokens = tokens_;
  s.padded_tokens = padded_tokens_;
  s.micro_batches = micro_batches_;
  s.tokens_per_s = seconds > 0 ? static_cast<double>(tokens_ - start_tokens_) / seconds : 0;
  s.token_budget = fixed_ ? 0 : budget_;
  s.target_tokens = target_tokens_;  // 0: fixed batches, a set count a step
  s.micro_batch_size = fixed_ ? fixed_batch_size_ : start_plan_.micro_batch_size;
  s.accumulation_steps = group_size_ > 0 ? group_size_ : 1;
  s.global_batch_size = s.steps > 0 ? s.samples / s.steps : 0;
  s.world_size = 1;
}

}  // namespace batchtune
