#include "batchtune/common/option.h"

#include <c10/util/Exception.h>

#include <array>
#include <utility>

namespace batchtune {
namespace {

/// Marks a `mention` in a message: a control character no flag, number or
/// word contains.
constexpr char kMark = '\x1f';

struct OptionNames {
  Option option;
  const char* cli;
  const char* python;
};

// The CLI's flags (tools/) and the Python package's arguments (python/batchtune).
constexpr std::array<OptionNames, kOptionCount> kNames{{
    {Option::kMemoryLimit, "--memory-limit", "memory_limit"},
    {Option::kMargin, "--margin", "margin"},
    {Option::kTimeBudget, "--time-budget", "time_budget"},
    {Option::kMaxBatch, "--max-batch", "max_batch"},
    {Option::kStrategy, "--strategy", "strategy"},
    {Option::kSearchTolerance, "--search-tolerance", "search_tolerance"},
    {Option::kTolerance, "--tolerance", "tolerance"},
    {Option::kObjective, "--objective", "objective"},
    {Option::kEta, "--eta", "eta"},
    {Option::kNoiseSteps, "--noise-steps", "noise_steps"},
    {Option::kAmp, "--amp", "amp"},
    {Option::kBatchSize, "--batch-size", "batch_size"},
    {Option::kTargetBatch, "--target-batch", "target_batch"},
    {Option::kBaseLr, "--base-lr", "base_lr"},
    {Option::kBaseBatch, "--base-batch", "base_batch"},
    {Option::kLrScaling, "--lr-scaling", "lr_scaling"},
    {Option::kWarmup, "--warmup", "warmup_steps"},
    {Option::kWorkers, "--workers", "workers"},
    {Option::kPrefetch, "--prefetch", "prefetch"},
    {Option::kMultipleOf, "--multiple-of", "multiple_of"},
    {Option::kLr, "--lr", "lr"},
    {Option::kWorldSize, "--world-size", "world_size"},
    {Option::kDevice, "--device", "device"},
    {Option::kSteps, "--steps", "steps"},
    {Option::kData, "--data", "data"},
    // Python's own workload: model, optimizer, loss_fn, make_batch.
    {Option::kModel, "--model", "model"},
    {Option::kOptimizer, "--optimizer", "optimizer"},
    {Option::kLoss, "--loss", "loss_fn"},
    {Option::kInput, "--input", "make_batch"},
    // The CLI's alone: Python's name is the flag's, as for --data.
    {Option::kInputSpec, "--input-spec", "input_spec"},
    {Option::kVocab, "--vocab", "vocab"},
    {Option::kClasses, "--classes", "classes"},
    {Option::kTarget, "--target", "target"},
    {Option::kLayers, "--layers", "layers"},
    {Option::kHeads, "--heads", "heads"},
    {Option::kWidth, "--width", "width"},
    {Option::kCheckpointing, "--checkpointing", "checkpointing"},
    {Option::kNproc, "--nproc", "nproc"},
    {Option::kNnodes, "--nnodes", "nnodes"},
    {Option::kNodeRank, "--node-rank", "node_rank"},
    {Option::kMaster, "--master", "master"},
    // Training: Python's Trainer takes plan, adapt, adapt_every, adapt_max_batch.
    {Option::kPlan, "--plan", "plan"},
    {Option::kEpochs, "--epochs", "epochs"},
    {Option::kSeed, "--seed", "seed"},
    {Option::kLogEvery, "--log-every", "log_every"},
    {Option::kCheckpoint, "--checkpoint", "checkpoint"},
    {Option::kCheckpointEvery, "--checkpoint-every", "checkpoint_every"},
    {Option::kResume, "--resume", "resume"},
    {Option::kEvalEvery, "--eval-every", "eval_every"},
    {Option::kEvalEverySamples, "--eval-every-samples", "eval_every_samples"},
    {Option::kTargetAccuracy, "--target-accuracy", "target_accuracy"},
    {Option::kTargetTokens, "--target-tokens", "target_tokens"},
    {Option::kTargetLoss, "--target-loss", "target_loss"},
    {Option::kTimeLimit, "--time-limit", "time_limit_s"},
    {Option::kAdapt, "--adapt", "adapt"},
    {Option::kAdaptEvery, "--adapt-every", "adapt_every"},
    {Option::kAdaptMaxBatch, "--adapt-max-batch", "adapt_max_batch"},
    {Option::kAdaptMinBatch, "--adapt-min-batch", "adapt_min_batch"},
    {Option::kAdaptLr, "--adapt-lr", "adapt_lr"},
    {Option::kNoiseScale, "--no-noise-scale", "no_noise_scale"},
}};

const OptionNames& names_of(Option option) {
  const OptionNames* found = nullptr;
  for (const auto& names : kNames) {
    if (names.option == option) found = &names;
  }
  TORCH_CHECK(found != nullptr, "batchtune: Option ", static_cast<int>(option),
              " has no row of names in option.cpp's kNames; add one");
  return *found;
}

}  // namespace

std::string option_name(Option option, FrontEnd front_end) {
  const OptionNames& names = names_of(option);
  return front_end == FrontEnd::kCli ? names.cli : names.python;
}

std::optional<Option> find_option(const std::string& name, FrontEnd front_end) {
  for (const auto& names : kNames) {
    if (name == (front_end == FrontEnd::kCli ? names.cli : names.python)) return names.option;
  }
  return std::nullopt;
}

std::string option_source(Option option, FrontEnd front_end, const OptionSources& sources) {
  const auto it = sources.find(option);
  return it != sources.end() ? it->second : option_name(option, front_end);
}

std::string as_asked(Option option, FrontEnd front_end, const OptionSources& sources) {
  const auto it = sources.find(option);
  return it != sources.end() ? it->second : "as asked with " + option_name(option, front_end);
}

std::string mention(Option option) {
  return std::string(1, kMark) + std::to_string(static_cast<int>(option)) + kMark;
}

std::string name_options(const std::string& text, FrontEnd front_end) {
  std::string out;
  size_t at = 0;
  while (true) {
    const size_t open = text.find(kMark, at);
    const size_t close = open == std::string::npos ? open : text.find(kMark, open + 1);
    if (close == std::string::npos) break;
    out.append(text, at, open - at);
    const int id = std::stoi(text.substr(open + 1, close - open - 1));
    out += option_name(static_cast<Option>(id), front_end);
    at = close + 1;
  }
  out.append(text, at, std::string::npos);
  return out;
}

OptionError::OptionError(Option option, std::string detail)
    : OptionError(option, std::string(), std::move(detail)) {}

OptionError::OptionError(Option option, std::string value, std::string detail)
    : Error(option_name(option, FrontEnd::kCli) + (value.empty() ? "" : " " + value) + ": " +
            name_options(detail, FrontEnd::kCli)),
      option_(option),
      value_(std::move(value)),
      detail_(std::move(detail)) {}

std::string OptionError::message(FrontEnd front_end) const {
  return option_name(option_, front_end) + (value_.empty() ? "" : " " + value_) + ": " +
         name_options(detail_, front_end);
}

}  // namespace batchtune
