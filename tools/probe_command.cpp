#include <fmt/format.h>

#include <algorithm>
#include <iostream>

#include "batchtune/reports/console_reporter.h"
#include "batchtune/common/atomic_file.h"
#include "batchtune/common/error.h"
#include "batchtune/reports/json_reporter.h"
#include "batchtune/step/amp.h"
#include "batchtune/step/trial.h"
#include "batchtune/tuning/sweep.h"
#include "commands.h"
#include "workload_flags.h"

namespace batchtune::cli {
namespace {

// Timed or untimed steps of one probe at most: a million steps is hours.
constexpr int64_t kMaxProbeSteps = 1000000;
// --min-time at most: an hour of timing answers nothing a minute does not.
constexpr double kMaxProbeSeconds = 3600;

struct ProbeFlags {
  WorkloadFlags workload;
  int64_t batch_size = 0;
  int64_t steps = 3;
  int64_t warmup = 1;
  double min_time = kSweepMinTimedSeconds;
  double margin = kDefaultMargin;
  std::string amp = "auto";
  std::string json;
};

int run_probe(const ProbeFlags& flags) {
  std::vector<FileRole> files = workload_file_roles(flags.workload);
  files.push_back({"--json", flags.json, FileAccess::kWrite});
  check_file_roles(files);
  check_output_file(flags.json, "--json");
  if (flags.steps < 1 || flags.steps > kMaxProbeSteps) {
    throw Error(fmt::format("--steps: must be from 1 to {}, got {}", kMaxProbeSteps, flags.steps));
  }
  if (flags.warmup < 0 || flags.warmup > kMaxProbeSteps) {
    throw Error(fmt::format("--warmup-steps: must be from 0 to {}, got {}", kMaxProbeSteps,
                            flags.warmup));
  }
  if (!(flags.min_time >= 0 && flags.min_time <= kMaxProbeSeconds)) {
    throw Error(fmt::format("--min-time: must be from 0 to {:.0f} seconds, got {}",
                            kMaxProbeSeconds, flags.min_time));
  }
  check_margin(flags.margin);
  check_batch_size(flags.batch_size, input_spec_from_flags(flags.workload), "--batch-size");
  const AmpMode asked = parse_amp(flags.amp);
  ResolvedWorkload resolved = resolve_workload(flags.workload);
  // The step at the precision training would use (auto: as train resolves it).
  const AmpChoice amp = choose_amp(asked, *resolved.workload, *resolved.memory,
                                   std::min(std::max<int64_t>(flags.batch_size, 1), kAmpProbeMaxBatch),
                                   FrontEnd::kCli);
  TrialRunner runner(*resolved.workload, *resolved.memory, flags.margin, amp.mode);
  const TrialResult result = runner.run(TrialOptions()
                                            .batch_size(flags.batch_size)
                                            .steps(flags.steps)
                                            .warmup_steps(flags.warmup)
                                            .max_warmup_steps(flags.min_time > 0 ? std::max(flags.warmup, kSweepMaxWarmupSteps) : flags.warmup)
                                            .min_time_s(flags.min_time));
  if (flags.json != "-") {
    fmt::print("{} on {}, {} thread(s)\n", resolved.workload->model().describe(),
               resolved.memory->device().str(), resolved.threads);
    fmt::print("input: {}\n", describe(resolved.workload->input_spec()));
    fmt::print("{}\n", amp.reason);
    print_trial(std::cout, result);
  }
  if (!flags.json.empty()) write_json_output(flags.json, to_json(result));
  return 0;
}

}  // namespace

CommandRun add_probe_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("probe", "run the real training step at one batch size");
  auto flags = std::make_shared<ProbeFlags>();
  add_workload_flags(*cmd, flags->workload);
  cmd->add_option("--batch-size", flags->batch_size, "batch size to try")->required();
  cmd->add_option("--steps", flags->steps, "timed steps at least")->capture_default_str();
  cmd->add_option("--min-time", flags->min_time,
                  "seconds of timed steps at least, as a sweep row times (0: exactly --steps)")
      ->capture_default_str();
  cmd->add_option("--warmup-steps", flags->warmup, "untimed steps before them")
      ->capture_default_str();
  // The old spelling, kept working; elsewhere --warmup is the lr warm-up.
  cmd->add_option("--warmup", flags->warmup,
                  "old name of --warmup-steps (in train and plan, --warmup is the lr warm-up)");
  cmd->callback([cmd] {
    if (cmd->count("--warmup") > 0) {
      std::cerr << "note: probe's --warmup is now --warmup-steps (untimed steps); in train and "
                   "plan --warmup is the learning-rate warm-up\n";
    }
  });
  cmd->add_option("--margin", flags->margin,
                  "share of the capacity kept free (fits = peak <= capacity x (1 - margin))")
      ->capture_default_str();
  cmd->add_option("--amp", flags->amp,
                  "precision of the step: off, bf16, fp16 or auto (as train resolves it)")
      ->capture_default_str();
  cmd->add_option("--json", flags->json, "write the result as JSON to FILE, or - for stdout");
  return [flags] { return run_probe(*flags); };
}

}  // namespace batchtune::cli
