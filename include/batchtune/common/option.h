#pragma once

#include <map>
#include <optional>
#include <string>

#include "batchtune/common/error.h"

namespace batchtune {

/// The options of a tune, a probe and a plan that more than one front end
/// sets: each front end names them its own way (the CLI `--memory-limit`,
/// Python `memory_limit`), so a library message refers to them by this id.
enum class Option {
  kMemoryLimit,
  kMargin,
  kTimeBudget,
  kMaxBatch,
  kStrategy,
  kSearchTolerance,
  kTolerance,
  kObjective,
  kEta,
  kNoiseSteps,
  kAmp,
  kBatchSize,
  kTargetBatch,
  kBaseLr,
  kBaseBatch,
  kLrScaling,
  kWarmup,
  kWorkers,
  kPrefetch,
  kMultipleOf,
  kLr,
  kWorldSize,
  kDevice,  ///< the device trained and measured on ("cpu", "cuda:1")
  kSteps,   ///< a probe's timed steps
  kData,    ///< the training data (`TuneOptions::data`; Python's tune makes its own batches)
  // The workload: what the CLI builds and Python is handed (its own model,
  // optimizer, loss_fn and make_batch).
  kModel,      ///< the model (a built-in name or a TorchScript file)
  kOptimizer,  ///< the optimizer (sgd, adam, adamw)
  kLoss,       ///< the loss (ce, mse, model); Python's loss_fn
  kInput,      ///< the input's shape and type; Python's make_batch makes them
  kInputSpec,  ///< a file of inputs and target as JSON
  kVocab,      ///< the vocabulary of token-id inputs
  kClasses,    ///< the class count of class targets
  kTarget,     ///< the target's kind (class, token, float:SHAPE, none)
  kLayers,     ///< the built-in gpt's layers
  kHeads,      ///< the built-in gpt's attention heads
  kWidth,      ///< the built-in gpt's width
  kCheckpointing,  ///< activation checkpointing (the built-in gpt's blocks; Python's modules)
  // The launcher (`batchtune launch`): Python runs under torchrun.
  kNproc,     ///< processes on this host
  kNnodes,    ///< hosts
  kNodeRank,  ///< this host's rank
  kMaster,    ///< node 0's ADDR:PORT
  // Training.
  kPlan,              ///< the plan trained by (Python's Trainer takes it as `plan`)
  kEpochs,            ///< epochs to train
  kSeed,              ///< the seed of the data's order and the model's initial weights
  kLogEvery,          ///< steps between log lines
  kCheckpoint,        ///< the checkpoint folder
  kCheckpointEvery,   ///< steps between checkpoints
  kResume,            ///< resume from the checkpoint folder
  kEvalEvery,         ///< steps between evaluations
  kEvalEverySamples,  ///< samples between evaluations
  kTargetAccuracy,    ///< the test accuracy that ends a run
  kTargetTokens,      ///< the tokens a step trains on, by a token budget
  kTargetLoss,        ///< the loss that ends a run
  kTimeLimit,         ///< the training seconds that end a run
  kAdapt,             ///< the global batch follows the gradient noise scale
  kAdaptEvery,        ///< steps between adapt's decisions
  kAdaptMaxBatch,     ///< the largest global batch adapt may reach
  kAdaptMinBatch,     ///< the smallest global batch adapt may reach
  kAdaptLr,           ///< what adapt's lr follows: the gain or the batch ratio
  kNoiseScale,        ///< the gradient noise scale's measurement (`--no-noise-scale`)
  kLast = kNoiseScale,  ///< the last: `kOptionCount` counts up to it
};

/// How many `Option`s there are (their values run from 0 to this, less one).
constexpr int kOptionCount = static_cast<int>(Option::kLast) + 1;

/// Who shows a message: the command line or the Python package.
enum class FrontEnd { kCli, kPython };

/// `option` as `front_end` names it: "--time-budget" on the command line,
/// "time_budget" in Python.
/// Throws `c10::Error` (an internal invariant) for an option without a name.
std::string option_name(Option option, FrontEnd front_end);

/// The option `front_end` calls `name` ("--warmup" or "warmup_steps"), or
/// nullopt when none is called so.
std::optional<Option> find_option(const std::string& name, FrontEnd front_end);

/// Where the values of options that the caller did not give came from, in
/// words for a reason ("the optimizer's lr", "the Trainer's precision
/// 'bf16-mixed'"): an option without an entry was given as itself.
using OptionSources = std::map<Option, std::string>;

/// The words for where `option`'s value came from: its entry in `sources`,
/// else the option as `front_end` names it ("--base-lr", "base_lr").
std::string option_source(Option option, FrontEnd front_end, const OptionSources& sources);

/// Why a value is what it is when it was given: "as asked with --amp" (with
/// `front_end`'s name), or the words of its entry in `sources`.
std::string as_asked(Option option, FrontEnd front_end, const OptionSources& sources);

/// A reference to `option` inside a message, named when the message is shown
/// (`name_options`); `OptionError` names them in `what()` as the CLI does.
///
/// Example:
/// ```
///   throw OptionError(Option::kMemoryLimit,
///                     "too small; give a larger " + mention(Option::kMemoryLimit));
/// ```
std::string mention(Option option);

/// `text` with every `mention` named as `front_end` names it.
std::string name_options(const std::string& text, FrontEnd front_end);

/// Bad input for one option, as data: the option and what is wrong with it.
/// `what()` is the command line's text ("--time-budget: must be at least 1 s,
/// got 0.5"); `message(FrontEnd::kPython)` the Python package's
/// ("time_budget: must be ..."). The CLI prints `what()`; the Python binding
/// raises `batchtune.Error` with the Python text and the option's Python name
/// as its `option` attribute.
///
/// Example:
/// ```
///   throw batchtune::OptionError(batchtune::Option::kTimeBudget,
///                                fmt::format("must be at least 1 s, got {}", seconds));
/// ```
class OptionError : public Error {
 public:
  /// `detail`: what is wrong and how to fix it, other options in it as `mention`s.
  OptionError(Option option, std::string detail);
  /// The same about the `value` given to `option`, shown after its name:
  /// "--model net.pt: no such file ..." (Python: "model net.pt: ...").
  OptionError(Option option, std::string value, std::string detail);

  Option option() const { return option_; }
  /// The value given to the option that the message is about, or "" when it names none.
  const std::string& value() const { return value_; }
  const std::string& detail() const { return detail_; }
  /// "<option>[ <value>]: <detail>", every option named as `front_end` names it.
  std::string message(FrontEnd front_end) const;

 private:
  Option option_;
  std::string value_;
  std::string detail_;
};

}  // namespace batchtune
