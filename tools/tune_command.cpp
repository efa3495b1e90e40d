#include <fmt/format.h>
#include <fmt/ostream.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <thread>

#include "batchtune/reports/console_reporter.h"
#include "batchtune/monitoring/energy.h"
#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/reports/json_reporter.h"
#include "batchtune/monitoring/monitor.h"
#include "batchtune/tuning/search.h"
#include "batchtune/tuning/sweep.h"
#include "batchtune/reports/tune_report.h"
#include "batchtune/common/atomic_file.h"
#include "batchtune/step/trial.h"
#include "batchtune/plan/plan.h"
#include "batchtune/reports/train_reporter.h"
#include "batchtune/tuning/loader_tuning.h"
#include "commands.h"
#include "batchtune/distributed/data_parallel.h"
#include "data_flags.h"
#include "distributed_flags.h"
#include "plan_flags.h"
#include "tune_objectives.h"
#include "workload_flags.h"

namespace batchtune::cli {
namespace {

// The monitor samples faster than `batchtune monitor`'s default so that short
// sweep trials still get readings.
constexpr double kTuneMonitorIntervalMs = 50;

/// Mean utilization and energy of `device` over a trial that ran from t0 to t1.
void attach_readings(const Monitor& monitor, const std::string& device, double t0, double t1,
                     TrialResult& trial) {
  for (const auto& s : monitor.summarize(t0, t1)) {
    if (s.device != device) continue;
    trial.utilization = s.mean_utilization_percent;
    double timed = 0;
    for (double seconds : trial.step_seconds) timed += seconds;
    trial.energy_joules = trial_energy_joules(s, timed, t1 - t0);
  }
}

/// What an interrupted tune keeps: the trials it finished, the largest that
/// fitted as the answer, and a sweep row per batch size timed so far.
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

void keep_partial_results(TuneReport& report, const std::vector<TrialResult>& measured,
                          const std::vector<TrialResult>& swept, SearchStrategy strategy) {
  report.complete = false;
  if (report.search.trials.empty()) {  // interrupted during the search
    report.search.strategy = strategy;
    report.search.trials = measured;
    for (const auto& t : measured) {
      if (t.fits) report.search.max_batch_size = std::max(report.search.max_batch_size, t.batch_size);
      report.search.steps += t.steps_run;
    }
    report.search.stop_reason = "interrupted by " + interrupt_name();
  }
  if (report.sweep.empty()) {
    // The last timing of each size wins, as in a finished sweep.
    std::map<int64_t, SweepRow> rows;
    for (const auto& t : swept) {
      if (t.fits) rows[t.batch_size] = sweep_row(t);
    }
    for (const auto& [batch, row] : rows) report.sweep.push_back(row);
  }
}

// Search trials: one untimed step (it allocates the optimizer state, which
// must be counted) and one timed step.
constexpr int64_t kSearchWarmupSteps = 1;
constexpr int64_t kSearchTimedSteps = 1;

struct TuneFlags {
  WorkloadFlags workload;
  DataFlags data;
  std::string strategy = "predict";
  int64_t max_batch = kDefaultMaxBatch;
  double time_budget = kDefaultTimeBudgetSeconds;
  double margin = kDefaultMargin;
  double search_tolerance = kDefaultSearchTolerance;
  bool search_only = false;
  std::string objective = "throughput";
  double tolerance = kDefaultThroughputTolerance;
  std::string json;
  std::string report;
  PlanFlags plan;
  ObjectiveFlags objectives;
  DistributedFlags distributed;
};

int run_tune(const TuneFlags& flags, const CLI::App& cmd) {
  const SearchOptions options = SearchOptions()
                                    .strategy(parse_search_strategy(flags.strategy))
                                    .max_batch(flags.max_batch)
                                    .time_budget_s(flags.time_budget)
                                    .tolerance(flags.search_tolerance);
  for (const char* name : {"--batch-size", "--plan"}) {
    if (cmd.count(name) > 0) {
      throw Error(fmt::format("{}: tune finds the micro-batch itself; use probe to try one size, "
                              "or train {} to train with one",
                              name, name));
    }
  }
  const Objective objective = parse_objective(flags.objective);
  if (!(flags.tolerance >= 0 && flags.tolerance < 1)) {
    throw Error(fmt::format("--tolerance: must be at least 0 and below 1, got {}", flags.tolerance));
  }
  if (!flags.report.empty() && flags.search_only) {
    throw Error("--report: needs the sweep; leave out --search-only");
  }
  check_objective_flags(flags.objectives, objective, cmd);
  // Ctrl-C or SIGTERM stops after the current trial; what was measured is
  // written, marked incomplete (a second one ends at once).
  InterruptHandler interrupts;
  WorkloadFlags workload_flags = flags.workload;
  const RankEnvironment env = place_rank(flags.distributed, workload_flags);
  const DataSplits data = open_data(flags.data, workload_flags);
  ResolvedWorkload resolved = resolve_workload(workload_flags);
  // Data parallel: every rank probes its own device; rank 0 alone prints.
  Job job = join_job(flags.distributed, env, resolved.memory->device());
  DataParallel data_parallel(job.communicator.get());
  TrialRunner runner(*resolved.workload, *resolved.memory, flags.margin);
  const std::string device = resolved.memory->device().str();
  Monitor monitor(make_sampler(resolved.memory->device()),
                  MonitorOptions().interval_ms(kTuneMonitorIntervalMs));
  check_energy_readable(objective, monitor.sampler().unavailable_reason());
  const double run_start = monitor.now_s();
  const bool to_stdout = flags.json == "-";
  std::ostream& out = !job.primary() ? null_stream() : to_stdout ? std::cerr : std::cout;
  fmt::print(out, "{} on {}, {} thread(s); searching the largest batch that fits ({})\n",
             resolved.workload->model().describe(), resolved.memory->device().str(),
             resolved.threads, to_string(options.strategy()));
  if (data.train && !data.train->synthetic()) fmt::print(out, "data: {}\n", data.train->describe());
  out << std::flush;

  TuneReport report;
  report.workload = resolved.workload->model().describe();
  report.device = resolved.memory->device().str();
  report.threads = resolved.threads;
  report.objective = objective;
  report.capacity_bytes = resolved.memory->capacity_bytes();
  report.usable_bytes = resolved.memory->usable_bytes();
  report.margin = flags.margin;
  std::optional<Plan> plan;
  // Every trial as it ends, so that an interruption keeps what was measured.
  std::vector<TrialResult> measured;
  std::vector<TrialResult> swept;
  LoaderTuning loader;
  // A progress line on a terminal only, overwritten in place.
  const bool progress = job.primary() && isatty(fileno(stderr)) != 0;
  try {
    SearchResult search = search_max_batch(
        [&](int64_t batch) {
          throw_if_interrupted();
          if (progress) fmt::print(stderr, "\r\033[Ktrial: batch {} ...", batch);
          const double t0 = monitor.now_s();
          TrialResult trial = runner.run(TrialOptions()
                                             .batch_size(batch)
                                             .steps(kSearchTimedSteps)
                                             .warmup_steps(kSearchWarmupSteps));
          report.phases.push_back({t0 - run_start, monitor.now_s() - run_start, batch, "search"});
          return trial;
        },
        options, steady_clock(),
        [&](const TrialResult& trial, size_t index) {
          measured.push_back(trial);
          if (progress) fmt::print(stderr, "\r\033[K{}", trial_progress_line(trial, index));
        });
    if (progress) fmt::print(stderr, "\r\033[K");
    if (env.distributed()) {
      // The job's largest micro-batch is the smallest rank's: each rank
      // searched alone (no collective inside a trial, so an out-of-memory
      // never leaves a rank waiting), and the minimum counts every one.
      const int64_t own = search.max_batch_size;
      search.max_batch_size = data_parallel.min(own);
      fmt::print(out, "rank 0 of {}: largest batch {} here, {} for the job (the smallest rank's)\n",
                 env.world_size, own, search.max_batch_size);
    }
    print_search(out, search);
    out << std::flush;  // progress for whoever reads a pipe (tee, a test)
    report.search = search;

    if (!flags.search_only && search.max_batch_size > 0) {
      const auto grid = sweep_grid(search.max_batch_size);
      fmt::print(out, "\nsweep: timing {} batch sizes up to {}\n", grid.size(),
                 search.max_batch_size);
      out << std::flush;
      report.sweep = run_sweep(
          [&](const TrialOptions& options) {
            throw_if_interrupted();
            if (progress) fmt::print(stderr, "\r\033[Ksweep: batch {} ...", options.batch_size());
            const double t0 = monitor.now_s();
            TrialResult trial = runner.run(options);
            attach_readings(monitor, device, t0, monitor.now_s(), trial);
            report.phases.push_back(
                {t0 - run_start, monitor.now_s() - run_start, options.batch_size(), "sweep"});
            swept.push_back(trial);
            return trial;
          },
          grid, search.trials);
      if (progress) fmt::print(stderr, "\r\033[K");
      if (const auto flops = resolved.workload->model().forward_flops_per_sample()) {
        add_flops(report.sweep, *flops);
      }
      if (!report.sweep.empty()) {
        const bool plain = objective == Objective::kThroughput || objective == Objective::kMaxFit;
        report.selection = select_batch(report.sweep, plain ? objective : Objective::kThroughput,
                                        flags.tolerance);
        apply_energy(report, flags.objectives, monitor.sampler().unavailable_reason());
        report.diagnosis = diagnose(report.sweep, report.selection, flags.tolerance);
      }
      monitor.stop();
      for (const auto& sample : monitor.samples()) {
        if (sample.device == device) {
          report.timeline.push_back({sample.time_s - run_start, sample.utilization_percent});
        }
      }
      report.utilization_note = monitor.sampler().describe();
      const std::string missing = monitor.sampler().unavailable_reason();
      if (!missing.empty()) report.utilization_note += "; n/a: " + missing;
      if (resolved.memory->device().is_cpu()) {
        report.utilization_note += "; GPU utilization unavailable: " + gpu_unavailable_reason();
      }
      print_sweep(out, report);
    }
    PlanFlags plan_flags = flags.plan;
    if (objective == Objective::kGoodput && report.selection.batch_size > 0) {
      if (!data.train) throw Error("--objective goodput: needs float inputs to train on; use --data");
      plan_flags = apply_goodput(report, flags.objectives, flags.plan, cmd, *resolved.workload,
                                 *resolved.memory, *data.train, out);
    }
    if (!flags.search_only && report.selection.batch_size > 0) {
      plan_flags.world_size = env.world_size;
      plan = data_parallel.agree_plan(
          resolve_plan(plan_flags, cmd, *resolved.workload, *resolved.memory, flags.max_batch,
                       report.selection.batch_size,
                       fmt::format("micro-batch {}: {}", report.selection.batch_size,
                                   report.selection.reason)));
      if (objective == Objective::kGoodput) explain_goodput_plan(*plan);
      // The input pipeline, timed on the data at the chosen micro-batch.
      const auto row = std::find_if(report.sweep.begin(), report.sweep.end(), [&](const auto& r) {
        return r.batch_size == plan->micro_batch_size;
      });
      loader = data.train
                   ? tune_loader(runner, *data.train,
                                 std::min(plan->micro_batch_size, data.train->size()),
                                 row != report.sweep.end() ? row->step_ms / 1000 : 0,
                                 plan->prefetch, workload_flags.seed,
                                 std::max(1u, std::thread::hardware_concurrency()))
                   : LoaderTuning{{}, {}, "loader tuning skipped: the data are synthetic"};
      fmt::print(out, "\n{}", loader_table(loader));
      if (loader.choice && cmd.count("--workers") == 0) apply_loader_choice(*plan, *loader.choice);
      if (const auto wait = chosen_wait(loader); wait && *wait >= kLoaderMaxWait) {
        report.diagnosis = {"input-bound", input_diagnosis(*wait, loader.choice->workers)};
        fmt::print(out, "diagnosis: {}\n", report.diagnosis.text);
      }
      fmt::print(out, "\n");
      print_plan(out, *plan);
    }
  } catch (const Interrupted&) {
    if (progress) fmt::print(stderr, "\r\033[K");
    keep_partial_results(report, measured, swept, options.strategy());
    fmt::print(out, "\ninterrupted by {}: writing the {} trial(s) measured so far, marked "
               "incomplete\n", interrupt_name(), measured.size() + swept.size());
  }

  if (!job.primary()) return 0;  // one job, one result
  if (!job.primary()) return report.complete ? 0 : interrupt_exit_code();  // one job, one result
  if (!flags.report.empty()) {
    report.plan = plan;
    report.command_line = own_command_line();
    if (!report.complete) report.interrupted_by = interrupt_name();
    write_file_atomically(flags.report, html_report(report));
    fmt::print(out, "report: {}\n", flags.report);
  }
  nlohmann::json json = flags.search_only ? to_json(report.search) : to_json(report);
  if (plan) json["plan"] = to_json(*plan);
  if (!flags.search_only) {
    json["loader"] = to_json(loader.rows);
    json["loader_note"] = loader.note;
  }
  json["complete"] = report.complete;
  if (!report.complete) json["interrupted_by"] = interrupt_name();
  if (!flags.json.empty()) write_json_output(flags.json, json);
  return report.complete ? 0 : interrupt_exit_code();
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
                  "seconds; the search stops with the best size found so far")
      ->capture_default_str();
  cmd->add_option("--margin", flags->margin,
                  "share of the capacity kept free (fits = peak <= capacity x (1 - margin))")
      ->capture_default_str();
  cmd->add_option("--search-tolerance", flags->search_tolerance,
                  "predict stops once the true limit is at most this share above its answer")
      ->capture_default_str();
  cmd->add_flag("--search-only", flags->search_only, "only search the largest batch that fits");
  cmd->add_option("--objective", flags->objective,
                  "throughput (smallest batch within --tolerance of the fastest), max-fit, "
                  "goodput (throughput x statistical efficiency, from the gradient noise scale) "
                  "or energy (Zeus cost, see --eta)")
      ->capture_default_str();
  cmd->add_option("--tolerance", flags->tolerance,
                  "share of the best throughput within which the smallest batch is chosen")
      ->capture_default_str();
  cmd->add_option("--report", flags->report, "write an HTML report with plots to FILE");
  cmd->add_option("--json", flags->json, "write the result as JSON to FILE, or - for stdout");
  // The plan's flags; tune itself finds the micro-batch (see run_tune).
  add_plan_flags(*cmd, flags->plan);
  add_objective_flags(*cmd, flags->objectives);
  add_distributed_flags(*cmd, flags->distributed);
  return [flags, cmd] { return run_tune(*flags, *cmd); };
}

}  // namespace batchtune::cli
