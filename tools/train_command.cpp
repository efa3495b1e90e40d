// `batchtune train`: its flags, and training on image data (text:
// train_text_command.cpp).
#include "train_command.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <iostream>
#include <optional>

#include "batchtune/common/atomic_file.h"
#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/common/shape.h"
#include "batchtune/data/dataset.h"
#include "batchtune/monitoring/monitor.h"
#include "batchtune/reports/train_reporter.h"
#include "batchtune/reports/tune_report.h"
#include "batchtune/training/checkpoint.h"
#include "batchtune/training/trainer.h"
#include "batchtune/tuning/loader_tuning.h"
#include "batchtune/tuning/tune.h"
#include "commands.h"

namespace batchtune::cli {
namespace {

// The log line's utilization: the mean over this many recent seconds.
constexpr double kUtilizationWindowS = 5;

/// How often the progress bar is redrawn on a terminal.
constexpr double kProgressIntervalS = 0.25;

/// Passes over the data at most: a million epochs is past any training run,
/// and epochs × steps per epoch stays inside int64.
constexpr int64_t kMaxEpochs = 1000000;

/// The quick tune's throughput by global batch with its interval (its
/// micro-batches on every rank, no accumulation), which `--adapt` expects a
/// batch it has not run at; empty where no tune ran.
SpeedProfile speed_profile(const std::vector<SweepRow>& sweep, int64_t world_size) {
  SpeedProfile profile;
  for (const SweepRow& row : sweep) {
    if (row.samples_per_s <= 0) continue;
    const Estimate& ci = row.samples_per_s_ci;
    profile[row.batch_size * world_size] =
        ci.n > 0 ? TunedSpeed(row.samples_per_s, ci.low, ci.high) : TunedSpeed(row.samples_per_s);
  }
  return profile;
}

int run_train(const TrainFlags& flags, const CLI::App& cmd) {
  if (flags.epochs < 1 && flags.steps == 0) {
    throw Error(fmt::format("--epochs: must be at least 1, got {}", flags.epochs));
  }
  if (flags.steps < 0 || (cmd.count("--steps") > 0 && flags.steps < 1)) {
    throw Error(fmt::format("--steps: must be at least 1, got {}", flags.steps));
  }
  if (flags.epochs > kMaxEpochs) {
    throw Error(fmt::format("--epochs: must be at most {}, got {}", kMaxEpochs, flags.epochs));
  }
  for (const auto& [flag, value] :
       {std::pair<const char*, int64_t>{"--steps", flags.steps},
        {"--log-every", flags.log_every},
        {"--eval-every", flags.eval_every},
        {"--eval-every-samples", flags.eval_every_samples},
        {"--checkpoint-every", flags.checkpoint_every}}) {
    if (value > kMaxPlanCount) {
      throw Error(fmt::format("{}: must be at most {}, got {}", flag, kMaxPlanCount, value));
    }
  }
  if (flags.log_every < 0) {
    throw Error(fmt::format("--log-every: must be 0 (none) or more, got {}", flags.log_every));
  }
  if (flags.checkpoint_every < 0) {
    throw Error(fmt::format("--checkpoint-every: must be 0 (at the end only) or more, got {}",
                            flags.checkpoint_every));
  }
  if (flags.eval_every < 0) {
    throw Error(fmt::format("--eval-every: must be 0 (epoch ends only) or more, got {}",
                            flags.eval_every));
  }
  const bool text = flags.data.data.rfind("text:", 0) == 0;
  if (cmd.count("--target-accuracy") > 0) check_target_accuracy(flags.target_accuracy);
  if (cmd.count("--target-loss") > 0) {
    if (!(std::isfinite(flags.target_loss) && flags.target_loss > 0)) {
      throw Error(fmt::format("--target-loss: must be a positive loss, like 1.5; got {}",
                              flags.target_loss));
    }
    if (cmd.count("--target-accuracy") > 0) {
      throw Error("--target-loss: a run stops at one target; give it or --target-accuracy, not "
                  "both");
    }
  }
  for (const char* flag : {"--adapt-every", "--adapt-max-batch", "--adapt-min-batch",
                           "--adapt-lr"}) {
    if (cmd.count(flag) > 0 && !flags.adapt) {
      throw Error(fmt::format("{}: tunes --adapt; add --adapt, or leave it out", flag));
    }
  }
  parse_adapt_lr(flags.adapt_lr);
  if (flags.adapt_every < 1 || flags.adapt_every > kMaxPlanCount) {
    throw Error(fmt::format("--adapt-every: must be in [1, {}] optimizer steps, got {}",
                            kMaxPlanCount, flags.adapt_every));
  }
  if (flags.adapt_max_batch < 0 || flags.adapt_max_batch > kMaxPlanCount) {
    throw Error(fmt::format("--adapt-max-batch: must be in [0, {}] samples (0: {} x the starting "
                            "batch), got {}",
                            kMaxPlanCount, kDefaultAdaptGrowth, flags.adapt_max_batch));
  }
  if (flags.adapt_min_batch < 0 || flags.adapt_min_batch > kMaxPlanCount) {
    throw Error(fmt::format("--adapt-min-batch: must be in [0, {}] samples (0: the starting "
                            "batch / {}), got {}",
                            kMaxPlanCount, kDefaultAdaptGrowth, flags.adapt_min_batch));
  }
  if (flags.adapt && flags.no_noise_scale) {
    throw Error("--adapt: follows the gradient noise scale, which --no-noise-scale turns off; "
                "drop one of them");
  }
  if (flags.adapt && text && cmd.count("--batch-size") > 0) {
    throw Error("--adapt: with --data text:DIR it moves the real tokens per step of a token "
                "budget; leave out --batch-size (fixed batches), or --adapt");
  }
  if (flags.resume && flags.checkpoint.empty()) {
    throw Error("--resume: needs --checkpoint DIR to resume from");
  }
  if (flags.checkpoint_every > 0 && flags.checkpoint.empty()) {
    throw Error("--checkpoint-every: needs --checkpoint DIR to write to");
  }
  // Where the results go is checked before the work, not after it: first
  // against each other and the inputs, then each alone.
  std::vector<FileRole> files = workload_file_roles(flags.workload);
  files.push_back(data_file_role(flags.data));
  files.push_back({"--plan", flags.plan.plan_file, FileAccess::kRead});
  files.push_back({"--json", flags.json, FileAccess::kWrite});
  if (!flags.checkpoint.empty()) {
    for (const char* name : {kCheckpointFile, kModelStateFile, kModelScriptFile}) {
      files.push_back({"--checkpoint", flags.checkpoint + "/" + name, FileAccess::kWrite});
    }
  }
  check_file_roles(files);
  check_output_file(flags.json, "--json");
  prepare_output_directory(flags.checkpoint, "--checkpoint");
  // A bad plan file fails now, before the data loads and lines are printed;
  // the workload it was made for fills in what the flags leave out.
  WorkloadFlags workload_flags = flags.workload;
  if (!flags.plan.plan_file.empty()) {
    const Plan file = read_plan_file(flags.plan.plan_file);
    if (cmd.count("--model") == 0 && !file.workload.model.empty()) {
      workload_flags.model = file.workload.model;
    }
    if (cmd.count("--optimizer") == 0 && !file.workload.optimizer.empty()) {
      workload_flags.optimizer = file.workload.optimizer;
    }
  }
  const PlanRequest request = plan_request(flags.plan, cmd, flags.workload.lr);
  if (flags.target_tokens < 0 || (cmd.count("--target-tokens") > 0 && flags.target_tokens < 1)) {
    throw Error(fmt::format("--target-tokens: must be at least 1, got {}", flags.target_tokens));
  }
  if (text) {
    // Ctrl-C or SIGTERM stops after the current optimizer step, with a
    // checkpoint and a summary marked incomplete (a second one ends at once).
    InterruptHandler interrupts;
    std::optional<CheckpointLock> checkpoint_lock;
    if (!flags.checkpoint.empty()) checkpoint_lock.emplace(flags.checkpoint);
    return run_train_text(flags, cmd, workload_flags, request);
  }
  if (flags.target_tokens > 0) {
    throw Error("--target-tokens: only for token-budget training (--data text:DIR)");
  }
  // Ctrl-C or SIGTERM stops after the current optimizer step (or trial of
  // the quick tune), with a checkpoint and a summary marked incomplete (a
  // second one ends at once).
  InterruptHandler interrupts;
  // Data parallel: rank 0 alone prints and writes.
  const RankEnvironment env = place_rank(flags.distributed, workload_flags);
  std::ostream& out = env.rank != 0 ? null_stream() : flags.json == "-" ? std::cerr : std::cout;
  // Rank 0 alone writes the checkpoints, so it alone holds the folder.
  std::optional<CheckpointLock> checkpoint_lock;
  if (!flags.checkpoint.empty() && env.rank == 0) checkpoint_lock.emplace(flags.checkpoint);

  if (workload_flags.inputs.size() > 1 ||
      (!workload_flags.inputs.empty() &&
       workload_flags.inputs.front().find(':') != std::string::npos) ||
      !workload_flags.input_spec.empty()) {
    throw Error("--input: train reads one float input per sample (images, Fashion-MNIST) for now; "
                "token and multi-input specs work with probe and tune");
  }
  // Real data decide the input shape and the classes.
  const DataSplits data = open_data(flags.data, workload_flags);
  if (cmd.count("--target-accuracy") > 0 && !data.test) {
    throw Error(fmt::format("--target-accuracy: --data {} has no test split to evaluate on; use "
                            "--data fashion-mnist or an image folder with a test split",
                            flags.data.data));
  }
  if ((flags.eval_every > 0 || flags.eval_every_samples > 0) && !data.test) {
    throw Error(fmt::format("{}: --data {} has no test split to evaluate on",
                            flags.eval_every > 0 ? "--eval-every" : "--eval-every-samples",
                            flags.data.data));
  }
  ResolvedWorkload resolved = resolve_workload(workload_flags);
  Job job = join_job(flags.distributed, env, resolved.memory->device());
  DataParallel data_parallel(job.communicator.get());
  if (env.distributed()) {
    out << fmt::format("rank 0 of {} ({}, timeout {} s)\n", env.world_size,
                       job.communicator->backend(), flags.distributed.timeout_s);
  }
  out << fmt::format("{} on {}, {} thread(s); data: {}{}\n",
                     resolved.workload->model().describe(), resolved.memory->device().str(),
                     resolved.threads, data.train->describe(),
                     data.test ? "; test: " + data.test->describe() : std::string());
  PlanRequest job_request = request;
  job_request.world_size = env.world_size;
  std::string amp_from_checkpoint;
  if (flags.resume && job_request.amp.value_or(AmpMode::kAuto) == AmpMode::kAuto) {
    // A resume trains at the precision the run was written with: a second
    // measurement of amp auto could answer otherwise, and the checkpoint
    // would then be refused.
    if (const auto saved = read_checkpoint_identity(flags.checkpoint)) {
      job_request.amp = parse_amp(saved->amp, "--resume");
      amp_from_checkpoint = fmt::format("amp {}: from the checkpoint in {} (a resume trains at "
                                        "the precision its run was written with)",
                                        saved->amp, flags.checkpoint);
    }
  }
  if (!job_request.micro_batch_size && job_request.plan_file.empty()) {
    out << "no --batch-size or --plan: a quick tune finds the micro-batch\n" << std::flush;
  }
  // A quick tune never tries a batch larger than the training data; its
  // progress shows on a terminal, and an interrupt ends it within a trial.
  ConsoleTuneReporter console(out, job.primary() && ::isatty(STDERR_FILENO) != 0 ? &std::cerr
                                                                                : nullptr);
  Plan plan;
  std::vector<SweepRow> sweep;  // the quick tune's, where one ran
  try {
    plan = data_parallel.agree_plan(resolve_plan(
        job_request, *resolved.workload, *resolved.memory, data.train->size(), &console,
        &data_parallel,
        [] {
          return interrupt_requested() ? std::optional<std::string>(interrupt_name())
                                       : std::nullopt;
        },
        data.train.get(), &sweep));
  } catch (const Interrupted&) {
    return interrupted_during_tune(out, job.primary() ? flags.json : "");
  }
  if (!amp_from_checkpoint.empty()) plan.set_reason(PlanField::kAmp, amp_from_checkpoint);
  print_plan(out, plan);

  Trainer trainer(*resolved.workload, *resolved.memory, plan, *data.train, data.test.get(),
                  TrainOptions()
                      .epochs(flags.epochs)
                      .steps(flags.steps)
                      .seed(flags.workload.seed)
                      .log_every(flags.log_every)
                      .progress_interval_s(kProgressIntervalS)
                      .checkpoint_dir(flags.checkpoint)
                      .checkpoint_every(flags.checkpoint_every)
                      .resume(flags.resume)
                      .eval_batch_size(plan.eval_micro_batch_size)
                      .measure_noise_scale(!flags.no_noise_scale)
                      .eval_every(flags.eval_every)
                      .eval_every_samples(flags.eval_every_samples)
                      .time_limit_s(flags.time_limit)
                      .adapt(flags.adapt)
                      .adapt_options(AdaptOptions()
                                         .every(flags.adapt_every)
                                         .max_global_batch(flags.adapt_max_batch)
                                         .min_global_batch(flags.adapt_min_batch)
                                         .lr(parse_adapt_lr(flags.adapt_lr))
                                         .speed_profile(speed_profile(sweep, plan.world_size)))
                      .target_accuracy(cmd.count("--target-accuracy") > 0
                                           ? std::optional<double>(flags.target_accuracy)
                                           : std::nullopt)
                      .target_loss(cmd.count("--target-loss") > 0
                                       ? std::optional<double>(flags.target_loss)
                                       : std::nullopt));
  // Device utilization for the log lines: the mean over the last few seconds.
  Monitor monitor(make_sampler(resolved.memory->device()));
  const std::string device = resolved.memory->device().str();
  trainer.set_utilization_source([&]() -> std::optional<double> {
    const double now = monitor.now_s();
    for (const auto& s : monitor.summarize(now - kUtilizationWindowS, now)) {
      if (s.device == device && s.mean_utilization_percent) {
        return *s.mean_utilization_percent / 100;  // the trainer takes a fraction
      }
    }
    return std::nullopt;
  });
  TrainConsoleReporter reporter(out, flags.json != "-" && ::isatty(STDOUT_FILENO) != 0);
  trainer.set_callback([&](const TrainEvent& e) { reporter.report(e); });
  trainer.set_communicator(job.communicator.get());
  TrainSummary summary;
  try {
    summary = trainer.run();
  } catch (const std::exception& e) {
    job.communicator->report_failure(first_line(e.what()));
    throw;
  }
  monitor.stop();
  reporter.summary(summary);
  out << input_diagnosis(summary.data_wait_fraction, plan.workers) << "\n";
  if (data.train->skipped_samples() > 0) {
    out << fmt::format("skipped {} unreadable file(s) (--skip-bad-samples)\n",
                       data.train->skipped_samples());
    for (const std::string& name : data.train->unreadable_classes()) {
      out << fmt::format("warning: class {}: every one of its images was unreadable, so the "
                         "model never saw it; fix or remove its files\n",
                         name);
    }
  }
  if (flags.memory_summary) out << resolved.memory->summary() << "\n";
  nlohmann::json json = to_json(summary);
  json["skipped_samples"] = data.train->skipped_samples();
  json["input_bound"] = summary.data_wait_fraction >= kInputBoundWait;
  if (!flags.json.empty() && job.primary()) write_json_output(flags.json, json);
  return summary.complete ? 0 : interrupt_exit_code();
}

}  // namespace

int interrupted_during_tune(std::ostream& out, const std::string& json) {
  TrainSummary stopped;
  stopped.complete = false;
  stopped.interrupted_by = interrupt_name();
  out << "interrupted by " << interrupt_name() << " during the quick tune: nothing trained\n";
  if (!json.empty()) write_json_output(json, to_json(stopped));
  return interrupt_exit_code();
}

CommandRun add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "train with a plan: accumulation, lr schedule, "
                                          "mixed precision, OOM recovery, checkpoints");
  auto flags = std::make_shared<TrainFlags>();
  add_workload_flags(*cmd, flags->workload);
  add_plan_flags(*cmd, flags->plan);
  add_distributed_flags(*cmd, flags->distributed);
  add_data_flags(*cmd, flags->data);
  cmd->add_option("--epochs", flags->epochs, "passes over the training set")
      ->capture_default_str();
  cmd->add_option("--steps", flags->steps, "optimizer steps in all (instead of --epochs)");
  cmd->add_option("--log-every", flags->log_every, "a log line every N optimizer steps (0: none)")
      ->capture_default_str();
  cmd->add_option("--target-tokens", flags->target_tokens,
                  "--data text: real tokens per optimizer step, reached by accumulating "
                  "micro-batches (default: the token budget)");
  cmd->add_option("--eval-every-samples", flags->eval_every_samples,
                  "evaluate the test split every N training samples whatever the batch (for "
                  "--adapt, whose batch grows), as well as at epoch ends");
  cmd->add_option("--eval-every", flags->eval_every,
                  "evaluate the test split every N optimizer steps as well as at epoch ends "
                  "(0: epoch ends only)");
  cmd->add_option("--target-accuracy", flags->target_accuracy,
                  "stop as soon as an evaluation reaches this test accuracy, a fraction in "
                  "(0, 1] (needs a test split; see --eval-every)");
  cmd->add_option("--target-loss", flags->target_loss,
                  "stop once the mean training loss over the last 10 optimizer steps is at or "
                  "below this (not with --target-accuracy)");
  cmd->add_option("--time-limit", flags->time_limit,
                  "stop after the optimizer step at which training time (evaluation excluded) "
                  "reaches SECONDS; the run counts as complete (0: no limit)");
  cmd->add_option("--checkpoint", flags->checkpoint, "directory for checkpoint.pt");
  cmd->add_option("--checkpoint-every", flags->checkpoint_every,
                  "a checkpoint every N optimizer steps, and at the end");
  cmd->add_flag("--resume", flags->resume, "continue from the checkpoint in --checkpoint DIR");
  cmd->add_flag("--no-noise-scale", flags->no_noise_scale,
                "do not measure the gradient noise scale (without accumulation it splits one "
                "step in 50 into two halves)");
  cmd->add_flag("--adapt", flags->adapt,
                "adapt the global batch and lr to the gradient noise scale as training goes: "
                "starts at the plan's (or --batch-size's) batch, shrinks or grows where "
                "goodput says "
                "(the JSON's batch_schedule); with --data text:DIR, the real tokens per step "
                "from --target-tokens");
  cmd->add_option("--adapt-every", flags->adapt_every,
                  "--adapt: optimizer steps between two decisions")
      ->capture_default_str();
  cmd->add_option("--adapt-max-batch", flags->adapt_max_batch,
                  fmt::format("--adapt: the largest global batch, in tokens for --data text "
                              "(0: {} x the starting batch, within the data)",
                              kDefaultAdaptGrowth));
  cmd->add_option("--adapt-min-batch", flags->adapt_min_batch,
                  fmt::format("--adapt: the smallest global batch, in tokens for --data text "
                              "(0: the starting batch / {}; the starting batch itself: never "
                              "below it)",
                              kDefaultAdaptGrowth));
  cmd->add_option("--adapt-lr", flags->adapt_lr,
                  "--adapt: what the lr of a new global batch follows, under the plan's rule "
                  "(sqrt for Adam): gain, the AdaScale gain (B/B0) x E(B), which grows slower "
                  "while the noise scale is small; batch, the batch ratio B/B0 alone")
      ->capture_default_str();
  cmd->add_flag("--memory-summary", flags->memory_summary,
                "print the device allocator's statistics at the end");
  cmd->add_option("--json", flags->json, "write the summary as JSON to FILE, or - for stdout");
  return [flags, cmd] { return run_train(*flags, *cmd); };
}

}  // namespace batchtune::cli
