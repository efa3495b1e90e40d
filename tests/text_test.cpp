#include "batchtune/data/text.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <cstdint>
#include <deque>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/common/option.h"
#include "batchtune/data/token_batches.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/workload.h"
#include "batchtune/training/token_trainer.h"
#include "batchtune/training/train_summary_json.h"
#include "batchtune/tuning/token_budget.h"
#include "fake_clock.h"
#include "image_folder_fixture.h"
#include "test_helpers.h"

namespace batchtune {
namespace {

using batchtune::testing::error_of;
using batchtune::testing::remove_tree;

/// A fresh folder under /tmp (POSIX: libtorch.so's std::filesystem crashes).
std::string temp_folder(const std::string& name) {
  std::string path = "/tmp/batchtune-text-" + name + "-XXXXXX";
  if (::mkdtemp(path.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return path;
}

constexpr int64_t kMiB = int64_t{1} << 20;

/// A folder of text files whose paragraphs run over `range`, seeded.
class TextFolder {
 public:
  TextFolder(const std::string& name, LengthRange range, int paragraphs, uint64_t seed)
      : dir_(temp_folder(name)) {
    ::mkdir((dir_ + "/sub").c_str(), 0755);
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int64_t> length(range.min + 1, range.max + 1);  // bytes
    std::uniform_int_distribution<int> letter('a', 'z');
    for (int file = 0; file < 4; ++file) {
      std::ofstream out(dir_ + (file % 2 ? "/sub" : "") + fmt::format("/doc{}.txt", file));
      for (int p = file; p < paragraphs; p += 4) {
        const int64_t bytes = length(rng);
        for (int64_t i = 0; i < bytes; ++i) out << static_cast<char>(letter(rng));
        out << "\n\n";
      }
    }
    std::ofstream binary(dir_ + "/image.bin", std::ios::binary);
    binary << std::string("GIF\0\0\1", 6);
  }
  ~TextFolder() { remove_tree(dir_); }
  std::string path() const { return dir_; }

 private:
  std::string dir_;
};

TEST(TextDataset, ParagraphsAreByteTokensAndTheNextByteIsTheTarget) {
  const std::string dir = temp_folder("small");
  std::ofstream(dir + "/a.txt") << "hello world\n\nab\n\n" << std::string(40, 'x');
  TextDataset text(dir, {4, 16});
  // "hello world" (10 tokens); "ab" (1 token) dropped; 40 x's: 16 + 16 + 5 tokens.
  EXPECT_EQ(text.lengths(), (std::vector<int64_t>{10, 16, 16, 5}));
  EXPECT_EQ(text.documents(), 1);
  const Batch b = text.get_batch({0, 3});
  ASSERT_EQ(b.input().sizes(), (std::vector<int64_t>{2, 10}));
  EXPECT_EQ(b.input()[0][0].item<int64_t>(), 'h');
  EXPECT_EQ(b.target[0][0].item<int64_t>(), 'e');
  EXPECT_EQ(b.target[0][9].item<int64_t>(), 'd');
  EXPECT_EQ(b.target[1][4].item<int64_t>(), 'x');
  EXPECT_EQ(b.target[1][5].item<int64_t>(), kIgnoreTarget) << "padding is ignored by the loss";
  EXPECT_EQ(b.input()[1][5].item<int64_t>(), 0);
  EXPECT_LT(b.input().max().item<int64_t>(), kByteVocab);
  remove_tree(dir);
}

TEST(TextDataset, LinksToFoldersAndFilesAlreadyReadAreReadOnce) {
  const std::string dir = temp_folder("links");
  std::ofstream(dir + "/a.txt") << "hello world\n\nsecond paragraph";
  ASSERT_EQ(::symlink(".", (dir + "/again").c_str()), 0);  // a loop back to the top
  ASSERT_EQ(::symlink((dir + "/a.txt").c_str(), (dir + "/b.txt").c_str()), 0);
  const TextDataset text(dir, {4, 64});
  EXPECT_EQ(text.documents(), 1);
  EXPECT_EQ(text.lengths(), (std::vector<int64_t>{10, 15}));
  remove_tree(dir);
}

TEST(TextDataset, WindowsLineEndsSeparateParagraphsToo) {
  const std::string dir = temp_folder("crlf");
  std::ofstream(dir + "/a.txt", std::ios::binary) << "hello world\r\n\r\nsecond\r\nparagraph";
  const TextDataset text(dir, {4, 64});
  EXPECT_EQ(text.lengths(), (std::vector<int64_t>{10, 15}));
  remove_tree(dir);
}

TEST(TextDataset, BadFoldersNameTheData) {
  EXPECT_NE(error_of([] { TextDataset("/nonexistent/text", {16, 512}); }).find("--data text:"),
            std::string::npos);
  const std::string empty = temp_folder("empty");
  EXPECT_NE(error_of([&] { TextDataset(empty, {16, 512}); }).find("no paragraph"),
            std::string::npos);
  remove_tree(empty);
}

TEST(LengthBucketSampler, CoversEverySampleOncePerEpochWithinTheBudget) {
  TextFolder folder("sampler", {16, 512}, 400, 5);
  TextDataset text(folder.path(), {16, 512});
  ASSERT_GT(text.size(), 300);
  const int64_t budget = 2048;
  std::vector<LengthBucket> buckets;
  for (int64_t bound : length_bucket_bounds({16, 512})) buckets.push_back({bound, budget / bound});
  LengthBucketSampler sampler(text.lengths(), buckets, budget, 7);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int> seen(static_cast<size_t>(text.size()), 0);
    int64_t tokens = 0;
    int64_t padded = 0;
    for (const TokenBatch& micro : sampler.epoch(epoch)) {
      ASSERT_FALSE(micro.indices.empty());
      int64_t longest = 0;
      int64_t lo = INT64_MAX;
      for (int64_t i : micro.indices) {
        ++seen[static_cast<size_t>(i)];
        longest = std::max(longest, text.lengths()[static_cast<size_t>(i)]);
        lo = std::min(lo, text.lengths()[static_cast<size_t>(i)]);
      }
      const int64_t padded_here = static_cast<int64_t>(micro.indices.size()) * longest;
      EXPECT_EQ(micro.padded_tokens, padded_here);
      EXPECT_LE(padded_here, budget) << "never past the budget";
      // Padding only within a bucket: every sample in the same bucket.
      const auto bucket_of = [&](int64_t l) {
        size_t k = 0;
        while (buckets[k].max_length < l) ++k;
        return k;
      };
      EXPECT_EQ(bucket_of(lo), bucket_of(longest));
      const Batch batch = text.get_batch(micro.indices);
      EXPECT_EQ(batch.input().numel(), padded_here);
      tokens += micro.tokens;
      padded += padded_here;
    }
    for (int count : seen) ASSERT_EQ(count, 1) << "each sample once per epoch";
    EXPECT_LT(1.0 - static_cast<double>(tokens) / static_cast<double>(padded), 0.3)
        << "buckets keep the padding low";
  }
  EXPECT_NE(sampler.epoch(0).front().indices, sampler.epoch(1).front().indices)
      << "each epoch shuffled anew";
  EXPECT_THROW(sampler.set_token_budget(100), Error) << "below the longest sample";
}

TEST(TokenTrainer, AnEpochOverLengths16To512UnderASmallBudgetRunsWithoutOutOfMemory) {
  TextFolder folder("epoch", {16, 512}, 120, 9);
  TextDataset text(folder.path(), {16, 512});
  auto memory = make_device_memory(c10::Device(c10::kCPU), 24 * kMiB);
  Workload workload(WorkloadOptions()
                        .model("gpt")
                        .input_spec(parse_input_flags(InputFlags().inputs({"int64:16..512"}).vocab(256)))
                        .gpt(GptOptions().layers(1).heads(2).width(32))
                        .seed(1));
  // A budget where the longest bucket's batch is small: 2 samples of 512.
  Plan plan;
  plan.token_budget = 1024;
  for (int64_t bound : length_bucket_bounds({16, 512})) {
    plan.length_buckets.push_back({bound, plan.token_budget / bound});
  }
  ASSERT_EQ(plan.length_buckets.back().micro_batch_size, 2);
  plan.lr = 3e-3;
  int64_t oom_events = 0;
  const TrainSummary s = train_by_tokens(
      workload, *memory, plan, text, TokenTrainOptions().run(TrainOptions().epochs(1).seed(2)).target_tokens(2048),
      [&](const TrainEvent& e) { oom_events += e.kind == TrainEvent::Kind::kOomRecovery; });
  EXPECT_EQ(s.oom_recoveries, 0);
  EXPECT_EQ(oom_events, 0);
  EXPECT_EQ(s.samples, text.size()) << "the whole epoch";
  EXPECT_DOUBLE_EQ(s.epochs, 1.0);
  int64_t tokens = 0;
  for (int64_t l : text.lengths()) tokens += l;
  EXPECT_EQ(s.tokens, tokens);
  EXPECT_GE(s.padded_tokens, s.tokens);
  EXPECT_LE(memory->peak_bytes(), memory->usable_bytes());
  EXPECT_TRUE(std::isfinite(s.final_loss));
  EXPECT_GT(s.tokens_per_s, 0);
  EXPECT_EQ(s.token_budget, 1024);
}

TEST(TokenTrainer, OutOfMemoryShrinksTheBudgetAndKeepsTheTokensPerStep) {
  TextFolder folder("oom", {16, 256}, 200, 4);
  TextDataset text(folder.path(), {16, 256});
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  Workload workload(WorkloadOptions()
                        .model("gpt")
                        .input_spec(parse_input_flags(InputFlags().inputs({"int64:16..256"}).vocab(256)))
                        .gpt(GptOptions().layers(1).heads(2).width(32))
                        .seed(1));
  Plan plan;
  plan.token_budget = 4096;
  for (int64_t bound : length_bucket_bounds({16, 256})) {
    plan.length_buckets.push_back({bound, plan.token_budget / bound});
  }
  // Measure one step's peak at the full budget, then squeeze the budget
  // below it mid-run.
  const int64_t usable_before = memory->usable_bytes();
  int64_t squeezed = 0;
  const TrainSummary s = train_by_tokens(
      workload, *memory, plan, text, TokenTrainOptions().run(TrainOptions().epochs(1)).target_tokens(4096),
      {}, [&](int64_t step) {
        if (step == 1) {
          squeezed = memory->live_bytes() + (memory->peak_bytes() - memory->live_bytes()) * 2 / 3;
          memory->set_usable_bytes(std::min(usable_before, squeezed));
        }
      });
  memory->set_usable_bytes(usable_before);
  EXPECT_GE(s.oom_recoveries, 1);
  EXPECT_LT(s.token_budget, 4096);
  EXPECT_EQ(s.samples, text.size()) << "the same samples, every one trained on";
}

/// A small gpt over random letters: its loss falls from ln 256 towards ln 26.
struct TargetLossRun {
  std::vector<double> losses;  ///< each optimizer step's
  int64_t targets_reached = 0;
  TrainSummary summary;
};

TargetLossRun train_to_loss(const TextDataset& text, std::optional<double> target,
                            testing::FakeClock& clock) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  Workload workload(WorkloadOptions()
                        .model("gpt")
                        .input_spec(parse_input_flags(InputFlags().inputs({"int64:16..64"}).vocab(256)))
                        .gpt(GptOptions().layers(1).heads(2).width(32))
                        .seed(3));
  Plan plan;
  plan.token_budget = 512;
  for (int64_t bound : length_bucket_bounds({16, 64})) {
    plan.length_buckets.push_back({bound, plan.token_budget / bound});
  }
  plan.lr = 1e-2;
  TargetLossRun run;
  run.summary = train_by_tokens(
      workload, *memory, plan, text,
      TokenTrainOptions().run(
          TrainOptions().epochs(4).seed(5).log_every(1).target_loss(target).loss_window(4).clock(
              &clock)),
      [&](const TrainEvent& e) {
        if (e.kind == TrainEvent::Kind::kLog) run.losses.push_back(e.loss);
        if (e.kind == TrainEvent::Kind::kTargetReached) ++run.targets_reached;
      },
      [&](int64_t) { clock.advance(1); });  // a step takes 1 s of the fake clock
  return run;
}

TEST(TokenTrainer, StopsOnceTheMovingMeanLossReachesTheTarget) {
  TextFolder folder("target", {16, 64}, 160, 6);
  TextDataset text(folder.path(), {16, 64});
  testing::FakeClock reference_clock;
  const TargetLossRun reference = train_to_loss(text, std::nullopt, reference_clock);
  ASSERT_GT(reference.losses.size(), 8U);
  // The moving means over 4 steps; the target is the lowest of the first
  // half, so that the run reaches it before its end.
  std::vector<double> means;
  std::deque<double> window;
  double sum = 0;
  for (double loss : reference.losses) {
    window.push_back(loss);
    sum += loss;
    if (window.size() > 4) {
      sum -= window.front();
      window.pop_front();
    }
    means.push_back(window.size() == 4 ? sum / 4 : 1e9);
  }
  const double target = *std::min_element(means.begin(), means.begin() + means.size() / 2);
  ASSERT_LT(target, reference.losses.front()) << "the loss falls";
  int64_t expected_steps = 0;
  while (means[static_cast<size_t>(expected_steps)] > target) ++expected_steps;
  ++expected_steps;  // steps are counted from 1
  ASSERT_LT(expected_steps, reference.summary.steps);

  testing::FakeClock clock;
  const TargetLossRun run = train_to_loss(text, target, clock);
  EXPECT_EQ(run.summary.steps, expected_steps);
  EXPECT_EQ(run.targets_reached, 1);
  ASSERT_TRUE(run.summary.target.has_value());
  EXPECT_EQ(run.summary.target->metric, "train_loss");
  EXPECT_TRUE(run.summary.target_reached);
  EXPECT_EQ(run.summary.steps_to_target, expected_steps);
  EXPECT_EQ(run.summary.samples_to_target, run.summary.samples);
  EXPECT_EQ(run.summary.seconds_to_target, static_cast<double>(expected_steps));
  EXPECT_LT(run.summary.samples, reference.summary.samples);
}

TEST(TokenTrainer, ATargetLossNotReachedLeavesTheToTargetFieldsEmpty) {
  TextFolder folder("unreached", {16, 64}, 40, 7);
  TextDataset text(folder.path(), {16, 64});
  testing::FakeClock clock;
  const TargetLossRun run = train_to_loss(text, 1e-6, clock);
  ASSERT_TRUE(run.summary.target.has_value());
  EXPECT_FALSE(run.summary.target_reached);
  EXPECT_FALSE(run.summary.steps_to_target.has_value());
  EXPECT_FALSE(run.summary.seconds_to_target.has_value());
  EXPECT_FALSE(run.summary.samples_to_target.has_value());
  EXPECT_DOUBLE_EQ(run.summary.epochs, 4.0);
}

TEST(TokenTrainer, FixedBatchesTakeOneMicroBatchAStepWhateverTheirPadding) {
  TextFolder folder("fixed", {16, 64}, 40, 9);
  TextDataset text(folder.path(), {16, 64});
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  Workload workload(WorkloadOptions()
                        .model("gpt")
                        .input_spec(parse_input_flags(InputFlags().inputs({"int64:16..64"}).vocab(256)))
                        .gpt(GptOptions().layers(1).heads(2).width(32))
                        .seed(3));
  Plan plan;
  plan.micro_batch_size = 2;
  plan.global_batch_size = 2;
  plan.lr = 1e-3;
  const TrainSummary s = train_by_tokens(
      workload, *memory, plan, text,
      TokenTrainOptions().run(TrainOptions().steps(5).seed(1)).fixed_batch_size(2).pad_to(64),
      nullptr, nullptr);
  EXPECT_EQ(s.steps, 5);
  EXPECT_EQ(s.micro_batches, 5) << "padding made the steps accumulate";
  EXPECT_EQ(s.samples, 10);
  EXPECT_EQ(s.global_batch_size, 2);
  EXPECT_EQ(s.accumulation_steps, 1);
}

TEST(TokenTrainer, ABadTargetLossIsRefusedNamingTheFlag) {
  TextFolder folder("badtarget", {16, 64}, 20, 8);
  TextDataset text(folder.path(), {16, 64});
  testing::FakeClock clock;
  for (double bad : {0.0, -1.0, std::nan("")}) {
    const std::string message = error_of([&] { train_to_loss(text, bad, clock); });
    EXPECT_NE(message.find("--target-loss"), std::string::npos) << bad << ": " << message;
  }
}

/// A token-budget run of a small gpt whose step takes 1 s of a fake clock
/// whatever its tokens: more tokens a step are that much faster per token.
struct TokenRunSetup {
  std::unique_ptr<DeviceMemory> memory = make_device_memory(c10::Device(c10::kCPU), 64 * kMiB);
  Workload workload{WorkloadOptions()
                        .model("gpt")
                        .input_spec(parse_input_flags(InputFlags().inputs({"int64:16..64"}).vocab(256)))
                        .gpt(GptOptions().layers(1).heads(2).width(32))
                        .seed(3)};
  Plan plan;
  testing::FakeClock clock;

  TokenRunSetup() {
    plan.token_budget = 1024;
    for (int64_t bound : length_bucket_bounds({16, 64})) {
      plan.length_buckets.push_back({bound, plan.token_budget / bound});
    }
    plan.lr = 1e-2;
    plan.lr_scaling = LrScaling::kSqrt;
  }
  TrainSummary run(const TextDataset& text, TokenTrainOptions options,
                   std::vector<TrainEvent>* events = nullptr) {
    options.run().seed(2).clock(&clock);
    return train_by_tokens(
        workload, *memory, plan, text, options,
        [&](const TrainEvent& e) {
          if (events != nullptr) events->push_back(e);
        },
        [&](int64_t) { clock.advance(1); });
  }
};

TEST(TokenTrainer, ATimeLimitStopsAfterTheStepThatReachesItAndTheRunIsComplete) {
  TextFolder folder("time_limit", {16, 64}, 80, 8);
  TextDataset text(folder.path(), {16, 64});
  TokenRunSetup setup;
  const TrainSummary s = setup.run(text, TokenTrainOptions().run(TrainOptions().epochs(50).time_limit_s(5.5)));
  // Steps 1-5 end at 1-5 s of the fake clock; step 6 ends at 6 s, past the
  // limit: the run stops there.
  EXPECT_EQ(s.steps, 6);
  EXPECT_TRUE(s.time_limit_reached);
  EXPECT_TRUE(s.complete);
  EXPECT_LT(s.epochs, 50.0);
  EXPECT_EQ(to_json(s).value("time_limit_reached", false), true);
  // A negative limit is refused before any step, naming the option.
  try {
    setup.run(text, TokenTrainOptions().run(TrainOptions().time_limit_s(-1)));
    FAIL() << "a negative time limit was accepted";
  } catch (const OptionError& e) {
    EXPECT_EQ(e.option(), Option::kTimeLimit);
  }
}

TEST(TokenTrainer, WhatOnlyATestSplitAnswersIsRefusedNamingTheFlag) {
  // Text has no test split: a target accuracy or an evaluation interval
  // would never be acted on, so the run refuses them before its first step.
  TextFolder folder("no_test_split", {16, 64}, 40, 8);
  TextDataset text(folder.path(), {16, 64});
  TokenRunSetup setup;
  const std::string accuracy = error_of([&] {
    setup.run(text, TokenTrainOptions().run(TrainOptions().steps(2).target_accuracy(0.9)));
  });
  EXPECT_EQ(accuracy.rfind("--target-accuracy:", 0), 0u) << accuracy;
  const std::string every = error_of([&] {
    setup.run(text, TokenTrainOptions().run(TrainOptions().steps(2).eval_every(1)));
  });
  EXPECT_EQ(every.rfind("--eval-every:", 0), 0u) << every;
}

TEST(TokenTrainer, ATextRunReportsEpochEndsAndProgressAsAnImageRunDoes) {
  // One loop for both: a text run ends each epoch with an event, and a
  // progress event comes every interval of training time and at the end.
  TextFolder folder("epoch_events", {16, 64}, 80, 8);
  TextDataset text(folder.path(), {16, 64});
  TokenRunSetup setup;
  std::vector<TrainEvent> events;
  const TrainSummary s = setup.run(
      text, TokenTrainOptions().run(TrainOptions().epochs(2).progress_interval_s(3)), &events);
  std::vector<TrainEvent> epoch_ends;
  std::vector<int64_t> progress_steps;
  for (const TrainEvent& e : events) {
    if (e.kind == TrainEvent::Kind::kEpochEnd) epoch_ends.push_back(e);
    if (e.kind == TrainEvent::Kind::kProgress) progress_steps.push_back(e.step);
  }
  ASSERT_EQ(epoch_ends.size(), 2u);
  EXPECT_EQ(epoch_ends[0].epoch, 0);
  EXPECT_EQ(epoch_ends[1].epoch, 1);
  EXPECT_LT(epoch_ends[0].step, epoch_ends[1].step);
  EXPECT_EQ(epoch_ends[1].step, s.steps) << "the last step ends the last epoch";
  EXPECT_DOUBLE_EQ(s.epochs, 2.0);
  // 1 s a step on the fake clock: steps 3, 6, ... and the last.
  ASSERT_FALSE(progress_steps.empty());
  EXPECT_EQ(progress_steps.front(), 3);
  EXPECT_EQ(progress_steps.back(), s.steps);
  EXPECT_EQ(static_cast<int64_t>(progress_steps.size()), s.steps / 3 + (s.steps % 3 != 0));
}

TEST(TokenTrainer, FewerTargetTokensThanTheBudgetMakeSmallerMicroBatches) {
  TextFolder folder("small-target", {16, 64}, 200, 10);
  TextDataset text(folder.path(), {16, 64});
  TokenRunSetup setup;
  const TrainSummary s = setup.run(text, TokenTrainOptions().run(TrainOptions().steps(6)).target_tokens(256));
  EXPECT_EQ(s.token_budget, 256) << "micro-batches of the step's size, not the plan's 1024";
  EXPECT_EQ(s.target_tokens, 256);
  EXPECT_GE(s.tokens, 6 * 256);
  // A step stops once it holds its target: at most one micro-batch of 256
  // padded tokens past it (at the plan's budget a step held up to 1024).
  EXPECT_LT(s.tokens, 6 * 2 * 256);
  ASSERT_TRUE(s.noise_scale.has_value()) << "the noise scale in tokens is measured by default";
  EXPECT_TRUE(s.batch_schedule.empty()) << "no schedule without --adapt";
}

TEST(TokenTrainer, AdaptGrowsTheTokensPerStepFromTheNextStepTrainingEverySampleOnce) {
  TextFolder folder("adapt", {16, 64}, 600, 11);
  TextDataset text(folder.path(), {16, 64});
  TokenRunSetup setup;
  std::vector<TrainEvent> events;
  const TrainSummary s = setup.run(
      text,
      TokenTrainOptions()
          .run(TrainOptions().epochs(1).log_every(1).adapt(true).adapt_options(
              AdaptOptions().every(5).min_global_batch(128)))  // growth alone
          .target_tokens(128),
      &events);

  ASSERT_GE(s.batch_schedule.size(), 2u) << "more tokens a step, as fast a step, are taken";
  const BatchChange& start = s.batch_schedule.front();
  EXPECT_EQ(start.step, 0);
  EXPECT_EQ(start.global_batch_size, 128);
  EXPECT_EQ(start.micro_batch_size, 128);
  EXPECT_EQ(start.lr, 1e-2);
  std::map<int64_t, const BatchChange*> changes;  // by the first step they train
  for (size_t i = 1; i < s.batch_schedule.size(); ++i) {
    const BatchChange& c = s.batch_schedule[i];
    EXPECT_EQ(c.step % 5, 0) << "decisions every 5 steps";
    EXPECT_GE(c.global_batch_size, 128);
    EXPECT_LE(c.global_batch_size, 128 * kDefaultAdaptGrowth);
    EXPECT_EQ(c.micro_batch_size, std::min<int64_t>(c.global_batch_size, 1024))
        << "micro-batches follow up to the plan's budget";
    EXPECT_TRUE(c.noise_scale.has_value());
    EXPECT_NE(c.reason.find("tokens/s"), std::string::npos) << c.reason;
    changes[c.step + 1] = &c;
  }
  int64_t change_events = 0;
  int64_t larger_at_once = 0;
  int64_t budget = start.micro_batch_size;
  for (const auto& e : events) {
    change_events += e.kind == TrainEvent::Kind::kBatchChange ? 1 : 0;
    if (e.kind != TrainEvent::Kind::kLog) continue;
    // The step after a change trains micro-batches of its budget already:
    // the rest of the epoch was batched anew.
    const auto it = changes.find(e.step);
    if (it != changes.end()) {
      EXPECT_LE(e.micro_batch_size, it->second->micro_batch_size) << "step " << e.step;
      larger_at_once += e.micro_batch_size > budget ? 1 : 0;
      budget = it->second->micro_batch_size;
    }
    EXPECT_LE(e.micro_batch_size, budget) << "step " << e.step;
  }
  EXPECT_GT(larger_at_once, 0) << "a larger budget shows in the very next step";
  EXPECT_EQ(change_events, static_cast<int64_t>(s.batch_schedule.size()) - 1);
  EXPECT_EQ(s.target_tokens, s.batch_schedule.back().global_batch_size);
  // The epoch's rest is batched anew at each change: every sample once.
  EXPECT_EQ(s.samples, text.size());
  int64_t tokens = 0;
  for (int64_t l : text.lengths()) tokens += l;
  EXPECT_EQ(s.tokens, tokens);
  EXPECT_DOUBLE_EQ(s.epochs, 1.0);
}

TEST(TokenTrainer, AdaptIsRefusedWithFixedBatchesOrWithoutTheNoiseScale) {
  TextFolder folder("adapt-bad", {16, 64}, 40, 12);
  TextDataset text(folder.path(), {16, 64});
  TokenRunSetup setup;
  const std::string fixed = error_of([&] {
    setup.run(text, TokenTrainOptions()
                        .run(TrainOptions().steps(2).adapt(true))
                        .fixed_batch_size(2)
                        .pad_to(64));
  });
  EXPECT_EQ(fixed.rfind("--adapt:", 0), 0u) << fixed;
  const std::string no_noise = error_of([&] {
    setup.run(text, TokenTrainOptions().run(
                        TrainOptions().steps(2).measure_noise_scale(false).adapt(true)));
  });
  EXPECT_EQ(no_noise.rfind("--adapt:", 0), 0u) << no_noise;
}

/// The parameters of `workload`'s model, copied.
std::vector<at::Tensor> weights_of(Workload& workload) {
  std::vector<at::Tensor> out;
  for (const auto& p : workload.model().parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST(TokenTrainer, ARunStoppedAtAnEpochsEndResumesTheWholeNextEpoch) {
  // It resumed "at step 2 (epoch 2, micro-batch 7 of it)" and skipped the
  // rest of epoch 2: 6 steps for 4 epochs, other weights.
  TextFolder folder("epoch-end", {16, 64}, 60, 21);
  TextDataset text(folder.path(), {16, 64});
  const std::string dir = temp_folder("epoch-end-ckpt");
  const auto options = [](TrainOptions r) { return TokenTrainOptions().run(r).target_tokens(128); };
  TokenRunSetup whole;
  std::vector<TrainEvent> whole_events;
  const TrainSummary s_whole = whole.run(text, options(TrainOptions().epochs(3)), &whole_events);
  int64_t first_end = 0;
  for (const auto& e : whole_events) {
    if (e.kind == TrainEvent::Kind::kEpochEnd) {
      first_end = e.step;
      break;
    }
  }
  ASSERT_GT(first_end, 0);
  ASSERT_LT(first_end, s_whole.steps);

  TokenRunSetup first;
  first.run(text, options(TrainOptions().steps(first_end).checkpoint_dir(dir)));
  TokenRunSetup second;
  std::vector<TrainEvent> events;
  const TrainSummary s_resumed =
      second.run(text, options(TrainOptions().epochs(3).checkpoint_dir(dir).resume(true)), &events);
  EXPECT_EQ(s_resumed.resumed_from_step, first_end);
  EXPECT_EQ(s_resumed.steps, s_whole.steps);
  EXPECT_EQ(s_resumed.samples, s_whole.samples) << "every sample of the next epochs, once each";
  EXPECT_EQ(s_resumed.tokens, s_whole.tokens);
  EXPECT_DOUBLE_EQ(s_resumed.epochs, 3.0);
  ASSERT_FALSE(events.empty());
  EXPECT_NE(events.front().message.find("(epoch 2, at its start)"), std::string::npos)
      << events.front().message;
  const auto a = weights_of(whole.workload);
  const auto b = weights_of(second.workload);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::allclose(a[i], b[i], 1e-5, 1e-6)) << i;
  remove_tree(dir);
}

TEST(TokenTrainer, AnInterruptedAdaptRunResumesTheSameStepsScheduleAndWeights) {
  TextFolder folder("resume", {16, 64}, 300, 12);
  TextDataset text(folder.path(), {16, 64});
  const std::string dir = temp_folder("resume-ckpt");
  const auto run = [&] {
    return TrainOptions()
        .epochs(2)
        .adapt(true)
        .adapt_options(AdaptOptions().every(5))
        .checkpoint_dir(dir)
        .checkpoint_every(4);
  };
  const auto options = [](TrainOptions r) { return TokenTrainOptions().run(r).target_tokens(128); };
  TokenRunSetup whole;
  const TrainSummary s_whole = whole.run(text, options(run().checkpoint_dir("")));
  ASSERT_GE(s_whole.batch_schedule.size(), 2u);
  const int64_t stop = s_whole.batch_schedule[1].step + 2;  // after a change, mid-window

  TokenRunSetup first;
  TrainSummary s_first;
  {
    InterruptHandler interrupts;
    s_first = train_by_tokens(
        first.workload, *first.memory, first.plan, text, options(run().seed(2).clock(&first.clock)),
        {}, [&](int64_t step) {
          first.clock.advance(1);
          if (step == stop - 1) request_interrupt(SIGINT);  // arrives during step `stop`
        });
    request_interrupt(0);  // handled: the runs below are not asked to stop
  }
  EXPECT_FALSE(s_first.complete);
  EXPECT_EQ(s_first.interrupted_by, "SIGINT");
  EXPECT_EQ(s_first.steps, stop) << "it stops after the step under way";

  TokenRunSetup second;
  std::vector<TrainEvent> events;
  const TrainSummary s_resumed = second.run(text, options(run().resume(true)), &events);
  EXPECT_TRUE(s_resumed.complete);
  EXPECT_EQ(s_resumed.resumed_from_step, stop);
  EXPECT_EQ(s_resumed.steps, s_whole.steps);
  EXPECT_EQ(s_resumed.samples, s_whole.samples) << "each sample of both epochs, once each";
  EXPECT_EQ(s_resumed.tokens, s_whole.tokens);
  EXPECT_EQ(s_resumed.micro_batches, s_whole.micro_batches);
  EXPECT_DOUBLE_EQ(s_resumed.epochs, 2.0);
  ASSERT_EQ(s_resumed.batch_schedule.size(), s_whole.batch_schedule.size());
  for (size_t i = 0; i < s_whole.batch_schedule.size(); ++i) {
    EXPECT_EQ(s_resumed.batch_schedule[i].step, s_whole.batch_schedule[i].step) << i;
    EXPECT_EQ(s_resumed.batch_schedule[i].global_batch_size,
              s_whole.batch_schedule[i].global_batch_size)
        << i;
    EXPECT_DOUBLE_EQ(s_resumed.batch_schedule[i].lr, s_whole.batch_schedule[i].lr) << i;
  }
  const auto a = weights_of(whole.workload);
  const auto b = weights_of(second.workload);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::allclose(a[i], b[i], 1e-5, 1e-6)) << i;
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front().kind, TrainEvent::Kind::kResumed);

  // The finished run resumed again: its summary, nothing trained.
  TokenRunSetup third;
  const TrainSummary again = third.run(text, options(run().resume(true)));
  EXPECT_TRUE(again.already_finished);
  EXPECT_EQ(again.steps, s_whole.steps);
  // Another start of the tokens per step is another run.
  TokenRunSetup other;
  const std::string message =
      error_of([&] { other.run(text, options(run().resume(true)).target_tokens(256)); });
  EXPECT_EQ(message.rfind("--resume: ", 0), 0u) << message;
  EXPECT_NE(message.find("--target-tokens 128, this one has 256"), std::string::npos) << message;
  // Without --target-tokens on the resume: not "this one has 0".
  TokenRunSetup without;
  const std::string none = error_of(
      [&] { without.run(text, TokenTrainOptions().run(run().resume(true))); });
  EXPECT_NE(none.find("--target-tokens 128, this one gives none; resume with the same "
                      "--target-tokens"),
            std::string::npos)
      << none;
  EXPECT_EQ(none.find("has 0"), std::string::npos) << none;
  remove_tree(dir);
}

TEST(TokenTrainer, ALossThatIsNotFiniteIsSaidOnceAsAnImageRunSaysIt) {
  // The one training loop watches the loss for text too (loss_watch_test.cpp).
  TextFolder folder("not-finite", {16, 64}, 80, 9);
  TextDataset text(folder.path(), {16, 64});
  TokenRunSetup setup;
  std::vector<std::string> said;
  const TrainSummary s = train_by_tokens(
      setup.workload, *setup.memory, setup.plan, text,
      TokenTrainOptions().run(TrainOptions().steps(15).seed(2).clock(&setup.clock)),
      [&](const TrainEvent& e) {
        if (e.kind == TrainEvent::Kind::kDivergence) said.push_back(e.message);
      },
      [&](int64_t step) {
        if (step != 3) return;
        at::NoGradGuard no_grad;
        for (auto& p : setup.workload.model().parameters()) p.fill_(NAN);
      });
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("the loss is not finite (nan) by step 10"), std::string::npos) << said[0];
  ASSERT_TRUE(s.divergence.has_value());
  EXPECT_EQ(s.divergence->kind, Divergence::Kind::kNotFinite);
  EXPECT_EQ(s.steps, 15);
}

/// `edit` applied to the bytes of `path`, written back.
template <typename Edit>
void edit_file(const std::string& path, Edit edit) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  edit(text);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

TEST(TokenTrainer, TextEditedWithItsParagraphCountKeptIsRefusedOnResumeNamingTheFolder) {
  // Words replaced, or a paragraph shortened, kept the count the identity
  // compared: the resume trained on other text without a word.
  TextFolder folder("edited", {16, 64}, 40, 5);
  const std::string dir = temp_folder("edited-ckpt");
  const auto options = [&](TrainOptions r) {
    return TokenTrainOptions().run(r.checkpoint_dir(dir)).target_tokens(128);
  };
  {
    const TextDataset text(folder.path(), {16, 64});
    TokenRunSetup first;
    first.run(text, options(TrainOptions().steps(3)));
  }
  const std::string doc = folder.path() + "/doc0.txt";
  std::string original;
  edit_file(doc, [&](std::string& t) { original = t; });
  const auto refused = [&](const std::string& what) {
    const TextDataset edited(folder.path(), {16, 64});
    TokenRunSetup second;
    const std::string message =
        error_of([&] { second.run(edited, options(TrainOptions().steps(6).resume(true))); });
    EXPECT_EQ(message.rfind("--resume: ", 0), 0u) << what << ": " << message;
    EXPECT_NE(message.find("other text than text:" + folder.path() + " holds now (the same 40 "
                           "paragraphs"),
              std::string::npos)
        << what << ": " << message;
    EXPECT_NE(message.find("give another --checkpoint DIR"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
  };
  // A word replaced: the same bytes, counts and lengths but one letter.
  edit_file(doc, [](std::string& t) { t[3] = t[3] == 'q' ? 'r' : 'q'; });
  refused("a letter replaced");
  // A paragraph two bytes shorter, still within the range (17 bytes at least).
  edit_file(doc, [&](std::string& t) {
    t = original;
    size_t begin = 0;
    for (size_t end; (end = t.find("\n\n", begin)) != std::string::npos; begin = end + 2) {
      if (end - begin >= 19) {
        t.erase(begin, 2);
        return;
      }
    }
    FAIL() << "no paragraph of 19 bytes or more in " << doc;
  });
  ASSERT_EQ(TextDataset(folder.path(), {16, 64}).size(), 40);
  refused("a paragraph shortened");

  // The text as it was: the run goes on.
  edit_file(doc, [&](std::string& t) { t = original; });
  const TextDataset text(folder.path(), {16, 64});
  TokenRunSetup third;
  const TrainSummary resumed = third.run(text, options(TrainOptions().steps(6).resume(true)));
  EXPECT_EQ(resumed.resumed_from_step, 3);
  EXPECT_EQ(resumed.steps, 6);
  remove_tree(dir);
}

}  // namespace
}  // namespace batchtune
