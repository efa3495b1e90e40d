#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "batchtune/common/atomic_file.h"
#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/reports/tune_report.h"
#include "batchtune/tuning/tune.h"
#include "batchtune/reports/train_reporter.h"
#include "commands.h"
#include "plan_flags.h"
#include "workload_flags.h"

namespace batchtune::cli {
namespace {

struct PlanCommandFlags {
  WorkloadFlags workload;
  PlanFlags plan;
  std::string json;
};

int run_plan(const PlanCommandFlags& flags, const CLI::App& cmd) {
  std::vector<FileRole> files = workload_file_roles(flags.workload);
  files.push_back({"--plan", flags.plan.plan_file, FileAccess::kRead});
  files.push_back({"--json", flags.json, FileAccess::kWrite});
  check_file_roles(files);
  check_output_file(flags.json, "--json");
  check_plan_flags(flags.plan, cmd);
  std::ostream& out = flags.json == "-" ? std::cerr : std::cout;
  Plan plan;
  const bool only_file = !flags.plan.plan_file.empty() &&
                         cmd.count_all() == cmd.count() + cmd.count("--plan") + cmd.count("--json");
  if (only_file) {
    // Reading and checking a plan needs no model.
    plan = read_plan_file(flags.plan.plan_file);
    out << flags.plan.plan_file << ": a valid plan\n";
  } else {
    ResolvedWorkload resolved = resolve_workload(flags.workload);
    // Without a batch size or a plan file a quick tune finds the micro-batch,
    // with its progress on the terminal.
    ConsoleTuneReporter console(out, isatty(fileno(stderr)) != 0 ? &std::cerr : nullptr);
    InterruptHandler interrupts;
    plan = resolve_plan(plan_request(flags.plan, cmd, flags.workload.lr), *resolved.workload,
                        *resolved.memory, kDefaultMaxBatch, &console, nullptr, [] {
                          return interrupt_requested() ? std::optional<std::string>(interrupt_name())
                                                       : std::nullopt;
                        });
    if (cmd.count("--batch-size") > 0) {
      // A micro-batch given, not measured: the plan binds only what was said,
      // so that `train --plan` may use it with any model, input and budget.
      PlanWorkload& w = plan.workload;
      if (cmd.count("--model") == 0) w.model.clear();
      w.parameters = 0;  // the micro-batch was not measured on this size
      if (cmd.count("--input") == 0 && cmd.count("--input-spec") == 0) w.input.clear();
      if (cmd.count("--optimizer") == 0) w.optimizer.clear();
      if (cmd.count("--memory-limit") == 0) w.memory_limit_bytes = 0;
      out << "the micro-batch was given, not measured: the plan binds "
          << (cmd.count("--model") > 0 ? "--model " + w.model : "no model")
          << " (train checks what it binds)\n";
    }
  }
  print_plan(out, plan);
  if (!flags.json.empty()) write_json_output(flags.json, to_json(plan));
  return 0;
}

}  // namespace

CommandRun add_plan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "plan", "print and check a plan file, or make a plan from the plan flags");
  auto flags = std::make_shared<PlanCommandFlags>();
  add_workload_flags(*cmd, flags->workload);
  add_plan_flags(*cmd, flags->plan);
  cmd->add_option("--json", flags->json, "write the plan as JSON to FILE, or - for stdout");
  return [flags, cmd] { return run_plan(*flags, *cmd); };
}

}  // namespace batchtune::cli
