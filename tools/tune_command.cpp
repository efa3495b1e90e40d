#include <fmt/format.h>
#include <fmt/ostream.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <thread>

#include "batchtune/common/atomic_file.h"
#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/distributed/data_parallel.h"
#include "batchtune/monitoring/monitor.h"
#include "batchtune/monitoring/sampler.h"
#include "batchtune/reports/tune_report.h"
#include "batchtune/tuning/tune.h"
#include "commands.h"
#include "batchtune/data/text.h"
#include "batchtune/data/token_batches.h"
#include "data_flags.h"
#include "distributed_flags.h"
#include "plan_flags.h"
#include "workload_flags.h"

namespace batchtune::cli {
namespace {

// The monitor samples faster than `batchtune monitor`'s default so that short
// sweep trials still get readings.
constexpr double kTuneMonitorIntervalMs = 50;

/// This process's command line, for the report.
std::string own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out;
  for (size_t start = 0; start < text.size();) {
    const size_t end = std::min(text.find('\0', start), text.size());
    std::string arg = text.substr(start, end - start);
    if (start == 0) arg = arg.substr(arg.rfind('/') + 1);  // the program's name, not its path
    const bool plain = !arg.empty() && arg.find_first_of(" \t'\"$\\") == std::string::npos;
    out += (out.empty() ? "" : " ") + (plain ? arg : "'" + arg + "'");
    start = end + 1;
  }
  return out;
}

struct TuneFlags {
  WorkloadFlags workload;
  DataFlags data;
  std::string strategy = "predict";
  int64_t max_batch = kDefaultMaxBatch;
  double time_budget = kDefaultTimeBudgetSeconds;
  double margin = kDefaultMargin;
  double search_tolerance = kDefaultSearchTolerance;
  bool search_only = false;
  std::string objective = "auto";
  double tolerance = kDefaultThroughputTolerance;
  double eta = kDefaultEta;
  int64_t noise_steps = kDefaultNoiseRunSteps;
  std::string json;
  std::string report;
  PlanFlags plan;
  DistributedFlags distributed;
};

/// `--objective`, where `auto` (the default) is `auto_objective`: goodput on
/// real image data with a free global batch, else throughput (and for
/// `--search-only`, which selects nothing).
Objective tune_objective(const TuneFlags& flags, const PlanRequest& request) {
  if (flags.objective != "auto") return parse_objective(flags.objective);
  const bool images = flags.data.data != "synthetic" && flags.data.data.rfind("text:", 0) != 0;
  return flags.search_only ? Objective::kThroughput : auto_objective(images, request);
}

int run_tune(const TuneFlags& flags, const CLI::App& cmd) {
  for (const char* name : {"--batch-size", "--plan"}) {
    if (cmd.count(name) > 0) {
      throw Error(fmt::format("{}: tune finds the micro-batch itself; use probe to try one size, "
                              "or train {} to train with one",
                              name, name));
    }
  }
  if (!flags.report.empty() && flags.search_only) {
    throw Error("--report: needs the sweep; leave out --search-only");
  }
  check_plan_flags(flags.plan, cmd);
  // Where the results go is checked before the work, not after it.
  std::vector<FileRole> files = workload_file_roles(flags.workload);
  files.push_back(data_file_role(flags.data));
  files.push_back({"--json", flags.json, FileAccess::kWrite});
  files.push_back({"--report", flags.report, FileAccess::kWrite});
  check_file_roles(files);
  check_output_file(flags.json, "--json");
  check_output_file(flags.report, "--report");
  PlanRequest request = plan_request(flags.plan, cmd, flags.workload.lr);
  WorkloadFlags workload_flags = flags.workload;
  // Text: the token budget is planned over the data's own lengths (the
  // paragraphs of 16 to 512 tokens that `train --data text:DIR` reads)
  // unless --input gives a range; the trials stay synthetic.
  const bool text = flags.data.data.rfind("text:", 0) == 0;
  std::string text_note;
  std::optional<TextDataset> text_data;
  if (text) {
    check_text_inputs(flags.data, workload_flags);
    text_data.emplace(flags.data.data.substr(5), LengthRange{16, 512});
    // The lr of a token plan belongs to the samples a step holds on average.
    request.mean_length = mean_length(text_data->lengths());
    if (cmd.count("--model") == 0 && workload_flags.model == "convnet") workload_flags.model = "gpt";
    if (workload_flags.inputs.empty() && workload_flags.input_spec.empty()) {
      const LengthRange lengths = text_data->length_range();
      workload_flags.inputs = {lengths.min < lengths.max
                                   ? fmt::format("int64:{}..{}", lengths.min, lengths.max)
                                   : fmt::format("int64:{}", lengths.max)};
      text_note = fmt::format("data: {}; lengths from the data: --input {}", text_data->describe(),
                              workload_flags.inputs.front());
    }
  }
  const Objective objective = tune_objective(flags, request);
  if (cmd.count("--eta") > 0 && objective != Objective::kEnergy) {
    throw Error("--eta: weighs the energy objective; add --objective energy");
  }
  TuneOptions options;
  options.search(SearchOptions()
                     .strategy(parse_search_strategy(flags.strategy))
                     .max_batch(flags.max_batch)
                     .tolerance(flags.search_tolerance))
      .time_budget_s(flags.time_budget)
      .margin(flags.margin)
      .search_only(flags.search_only)
      .objective(objective)
      .tolerance(flags.tolerance)
      .eta(flags.eta)
      .noise_steps(flags.noise_steps)
      .amp(parse_amp(flags.plan.amp))
      .seed(flags.workload.seed)
      .cores(std::max(1u, std::thread::hardware_concurrency()))
      .plan(request)
      .command_line(own_command_line());
  // Every option checked once: bad input fails before anything is printed.
  ResolvedTuneOptions resolved_options = resolve(options);
  // Ctrl-C or SIGTERM stops after the current trial; what was measured is
  // written, marked incomplete (a second one ends at once).
  InterruptHandler interrupts;
  resolved_options.stop([]() -> std::optional<std::string> {
    if (interrupt_requested()) return interrupt_name();
    return std::nullopt;
  });
  const RankEnvironment env = place_rank(flags.distributed, workload_flags);
  const DataSplits data = text ? DataSplits{} : open_data(flags.data, workload_flags);
  ResolvedWorkload resolved = resolve_workload(workload_flags);
  // Data parallel: every rank probes its own device; rank 0 alone prints.
  Job job = join_job(flags.distributed, env, resolved.memory->device());
  DataParallel data_parallel(job.communicator.get());
  resolved_options.data_parallel(&data_parallel).data(data.train.get());
  Monitor monitor(make_sampler(resolved.memory->device()),
                  MonitorOptions().interval_ms(kTuneMonitorIntervalMs));
  resolved_options.monitor(&monitor);

  const bool to_stdout = flags.json == "-";
  std::ostream& out = !job.primary() ? null_stream() : to_stdout ? std::cerr : std::cout;
  fmt::print(out, "{} on {}, {} thread(s)\n", resolved.workload->model().describe(),
             resolved.memory->device().str(), resolved.threads);
  if (env.distributed()) fmt::print(out, "rank 0 of {}\n", env.world_size);
  if (data.train && !data.train->synthetic()) fmt::print(out, "data: {}\n", data.train->describe());
  if (!text_note.empty()) fmt::print(out, "{}\n", text_note);
  out << std::flush;

  // A progress line on a terminal only, overwritten in place.
  const bool progress = job.primary() && isatty(fileno(stderr)) != 0;
  ConsoleTuneReporter console(out, progress ? &std::cerr : nullptr);
  TuneReporters reporters;
  reporters.add(&console);
  FileTuneReporter html(FileTuneReporter::Format::kHtml, [&](const std::string& page) {
    write_file_atomically(flags.report, page);
    fmt::print(out, "report: {}\n", flags.report);
  });
  FileTuneReporter json(FileTuneReporter::Format::kJson, [&](const std::string& text) {
    write_json_output(flags.json, nlohmann::json::parse(text));
  });
  // One job, one result: rank 0 alone writes.
  if (job.primary() && !flags.report.empty()) reporters.add(&html);
  if (job.primary() && !flags.json.empty()) reporters.add(&json);

  WorkloadSubject subject(*resolved.workload, *resolved.memory, resolved_options->margin());
  const TuneResult result = tune(subject, *resolved.memory, resolved_options, &reporters);
  return result.complete ? 0 : interrupt_exit_code();
}

}  // namespace

CommandRun add_tune_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "tune", "find the largest batch that fits, then the fastest, and plan training");
  auto flags = std::make_shared<TuneFlags>();
  add_workload_flags(*cmd, flags->workload);
  add_data_flags(*cmd, flags->data);
  cmd->add_option("--strategy", flags->strategy, "search: predict, power, binsearch or backoff")
      ->capture_default_str();
  cmd->add_option("--max-batch", flags->max_batch, "never try a batch above this")
      ->capture_default_str();
  cmd->add_option("--time-budget", flags->time_budget,
                  fmt::format("seconds for the whole tune (precision {:.0f} %, search {:.0f} %, "
                              "sweep {:.0f} %, noise run {:.0f} %, evaluation batch {:.0f} %, "
                              "loader {:.0f} %, unused time handed on); it stops with the best "
                              "found so far",
                              100 * kPrecisionBudgetShare, 100 * kSearchBudgetShare,
                              100 * kSweepBudgetShare, 100 * kNoiseBudgetShare,
                              100 * kEvalBudgetShare, 100 * kLoaderBudgetShare))
      ->capture_default_str();
  cmd->add_option("--margin", flags->margin,
                  "share of the capacity kept free (fits = peak <= capacity x (1 - margin))")
      ->capture_default_str();
  cmd->add_option("--search-tolerance", flags->search_tolerance,
                  "predict stops once the true limit is at most this share above its answer")
      ->capture_default_str();
  cmd->add_flag("--search-only", flags->search_only, "only search the largest batch that fits");
  cmd->add_option("--objective", flags->objective,
                  "auto (goodput with --data of images, else throughput), throughput "
                  "(smallest batch within --tolerance of the fastest), max-fit, goodput "
                  "(throughput x statistical efficiency, from the gradient noise scale) or "
                  "energy (Zeus cost, see --eta)")
      ->capture_default_str();
  cmd->add_option("--tolerance", flags->tolerance,
                  "share of the best throughput within which the smallest batch is chosen")
      ->capture_default_str();
  cmd->add_option("--eta", flags->eta,
                  "energy objective: weight of energy against time in the cost (0..1)")
      ->capture_default_str();
  cmd->add_option("--noise-steps", flags->noise_steps,
                  "goodput objective: optimizer steps of the noise-scale run")
      ->capture_default_str();
  cmd->add_option("--report", flags->report, "write an HTML report with plots to FILE");
  cmd->add_option("--json", flags->json, "write the result as JSON to FILE, or - for stdout");
  // The plan's flags; tune itself finds the micro-batch (see run_tune).
  add_plan_flags(*cmd, flags->plan);
  // Declared so that run_tune can say what to use instead, not listed in
  // --help: tune finds the micro-batch itself.
  for (const char* name : {"--batch-size", "--plan"}) cmd->get_option(name)->group("");
  add_distributed_flags(*cmd, flags->distributed);
  return [flags, cmd] { return run_tune(*flags, *cmd); };
}

}  // namespace batchtune::cli
