// `batchtune train --data text:DIR`: byte tokens by the plan's token budget.
#include <fmt/format.h>
#include <unistd.h>

#include <iostream>
#include <optional>

#include "batchtune/common/atomic_file.h"
#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/data/text.h"
#include "batchtune/data/token_batches.h"
#include "batchtune/distributed/distributed.h"
#include "batchtune/reports/train_reporter.h"
#include "batchtune/reports/tune_report.h"
#include "batchtune/training/checkpoint.h"
#include "batchtune/training/token_trainer.h"
#include "batchtune/tuning/tune.h"
#include "train_command.h"

namespace batchtune::cli {
namespace {

/// `--data text:DIR` without `--input`: paragraphs of 16 to 512 byte tokens,
/// the range being the data's own within those bounds.
constexpr const char* kTextDefaultInput = "int64:16..512";

}  // namespace

int run_train_text(const TrainFlags& flags, const CLI::App& cmd, WorkloadFlags workload_flags,
                   PlanRequest request) {
  // Launched by torchrun, each rank would train the whole run on its own
  // (and write the same checkpoint and summary): refused until text runs
  // are data parallel.
  if (const RankEnvironment env = rank_environment(); env.world_size > 1) {
    throw Error(fmt::format("--data text: trains in one process, not data parallel; launch it "
                            "without torchrun (WORLD_SIZE is {})",
                            env.world_size));
  }
  if (cmd.count("--target-accuracy") > 0 || flags.eval_every > 0 || flags.eval_every_samples > 0) {
    throw Error(fmt::format("{}: --data text has no test split to evaluate; stop at a training "
                            "loss with --target-loss",
                            cmd.count("--target-accuracy") > 0 ? "--target-accuracy"
                            : flags.eval_every > 0             ? "--eval-every"
                                                               : "--eval-every-samples"));
  }
  check_text_inputs(flags.data, workload_flags);
  if (cmd.count("--model") == 0 && workload_flags.model == "convnet") workload_flags.model = "gpt";
  const std::string dir = flags.data.data.substr(std::string("text:").size());
  if (workload_flags.inputs.empty() && workload_flags.input_spec.empty()) {
    // The lengths of the data themselves, as `tune --data text:DIR` reads them.
    const LengthRange lengths = TextDataset(dir, {16, 512}).length_range();
    workload_flags.inputs = {lengths.min < lengths.max
                                 ? fmt::format("int64:{}..{}", lengths.min, lengths.max)
                                 : std::string(kTextDefaultInput)};
  }
  const InputSpec spec = input_spec_from_flags(workload_flags);
  const auto range = length_range(spec);
  if (!range || spec.inputs.size() != 1 || spec.inputs.front().dtype != c10::kLong) {
    throw Error(fmt::format("--input: text trains on one token input with a length range, like "
                            "{}; got {}",
                            kTextDefaultInput, describe(spec)));
  }
  if (spec.inputs.front().vocab != kByteVocab) {
    throw Error(fmt::format("--vocab: text is byte tokens, so the vocabulary is {}; got {}",
                            kByteVocab, spec.inputs.front().vocab));
  }
  std::ostream& out = flags.json == "-" ? std::cerr : std::cout;
  const TextDataset text(dir, *range);
  // A token plan's lr belongs to the samples a step holds on average.
  request.mean_length = mean_length(text.lengths());
  ResolvedWorkload resolved = resolve_workload(workload_flags);
  out << fmt::format("{} on {}, {} thread(s); data: {}\n", resolved.workload->model().describe(),
                     resolved.memory->device().str(), resolved.threads, text.describe());
  const bool fixed = request.micro_batch_size.has_value() && request.plan_file.empty();
  // A resume trains the plan its run was written with: a new quick tune
  // could plan another token budget, and the checkpoint would be refused.
  std::optional<Plan> saved;
  if (flags.resume && !fixed && request.plan_file.empty()) {
    saved = read_checkpoint_plan(flags.checkpoint);
  }
  const bool quick_tune = !fixed && request.plan_file.empty() && !saved;
  if (quick_tune) {
    out << "no --batch-size or --plan: a quick tune plans the token budget\n" << std::flush;
  }
  ConsoleTuneReporter console(out, ::isatty(STDERR_FILENO) != 0 ? &std::cerr : nullptr);
  Plan plan;
  try {
    plan = saved ? *saved
                 : resolve_plan(request, *resolved.workload, *resolved.memory, text.size(),
                                &console, nullptr, [] {
                                  return interrupt_requested()
                                             ? std::optional<std::string>(interrupt_name())
                                             : std::nullopt;
                                });
  } catch (const Interrupted&) {
    return interrupted_during_tune(out, flags.json);
  }
  if (saved) {
    out << fmt::format("plan: from the checkpoint in {} (a resume trains the plan its run was "
                       "written with)\n",
                       flags.checkpoint);
  }
  if (!quick_tune) print_plan(out, plan);  // the quick tune's console printed its own
  if (!fixed && plan.token_budget < 1) {
    throw Error("--plan: this plan has no token_budget; make one with batchtune tune --input "
                "int64:MIN..MAX, or give --batch-size for fixed batches");
  }
  if (fixed) {
    out << fmt::format("fixed batches of {} padded to the longest sequence, {} tokens\n",
                       plan.micro_batch_size, range->max);
  }
  TrainConsoleReporter reporter(out, false);
  const TrainSummary summary = train_by_tokens(
      *resolved.workload, *resolved.memory, plan, text,
      TokenTrainOptions()
          .run(TrainOptions()
                   .epochs(flags.steps > 0 ? 1 : flags.epochs)
                   .steps(flags.steps)
                   .seed(flags.workload.seed)
                   .log_every(flags.log_every)
                   .checkpoint_dir(flags.checkpoint)
                   .checkpoint_every(flags.checkpoint_every)
                   .resume(flags.resume)
                   .time_limit_s(flags.time_limit)
                   .target_loss(cmd.count("--target-loss") > 0
                                    ? std::optional<double>(flags.target_loss)
                                    : std::nullopt)
                   .measure_noise_scale(!flags.no_noise_scale)
                   .adapt(flags.adapt)
                   .adapt_options(AdaptOptions()
                                      .every(flags.adapt_every)
                                      .max_global_batch(flags.adapt_max_batch)
                                      .min_global_batch(flags.adapt_min_batch)
                                      .lr(parse_adapt_lr(flags.adapt_lr))))
          .target_tokens(flags.target_tokens)
          .fixed_batch_size(fixed ? plan.micro_batch_size : 0)
          .pad_to(fixed ? range->max : 0),
      [&](const TrainEvent& e) {
        if (e.kind == TrainEvent::Kind::kLog) {
          out << fmt::format("step {}  epoch {}  loss {:.4f}  lr {:.3g}  {:.0f} samples/s  {}\n",
                             e.step, e.epoch + 1, e.loss, e.lr, e.samples_per_s, e.message);
        } else if (e.kind == TrainEvent::Kind::kOomRecovery ||
                   e.kind == TrainEvent::Kind::kTargetReached ||
                   e.kind == TrainEvent::Kind::kBatchChange ||
                   e.kind == TrainEvent::Kind::kDivergence ||
                   e.kind == TrainEvent::Kind::kCheckpoint ||
                   e.kind == TrainEvent::Kind::kResumed) {
          out << e.message << "\n";
        }
        out << std::flush;
      });
  reporter.summary(summary);
  if (flags.memory_summary) out << resolved.memory->summary() << "\n";
  if (!flags.json.empty()) write_json_output(flags.json, to_json(summary));
  return summary.complete ? 0 : interrupt_exit_code();
}

}  // namespace batchtune::cli
