#include <fmt/format.h>
#include <fmt/ostream.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <thread>

#include "batchtune/console_reporter.h"
#include "batchtune/error.h"
#include "batchtune/json_reporter.h"
#include "batchtune/monitor.h"
#include "batchtune/search.h"
#include "batchtune/sweep.h"
#include "batchtune/tune_report.h"
#include "batchtune/atomic_file.h"
#include "batchtune/trial.h"
#include "batchtune/plan.h"
#include "batchtune/train_reporter.h"
#include "batchtune/loader_tuning.h"
#include "commands.h"
#include "data_flags.h"
#include "plan_flags.h"
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
    if (s.energy_joules && t1 > t0) {
      // The counter covers warm-up too: keep the timed steps' share.
      double timed = 0;
      for (double seconds : trial.step_seconds) timed += seconds;
      trial.energy_joules = *s.energy_joules * std::min(1.0, timed / (t1 - t0));
    }
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
  WorkloadFlags workload_flags = flags.workload;
  const DataSplits data = open_data(flags.data, workload_flags);
  ResolvedWorkload resolved = resolve_workload(workload_flags);
  TrialRunner runner(*resolved.workload, *resolved.memory, flags.margin);
  const std::string device = resolved.memory->device().str();
  Monitor monitor(make_sampler(resolved.memory->device()),
                  MonitorOptions().interval_ms(kTuneMonitorIntervalMs));
  const double run_start = monitor.now_s();
  const bool to_stdout = flags.json == "-";
  std::ostream& out = to_stdout ? std::cerr : std::cout;
  fmt::print(out, "{} on {}, {} thread(s); searching the largest batch that fits ({})\n",
             resolved.workload->model().describe(), resolved.memory->device().str(),
             resolved.threads, to_string(options.strategy()));
  if (data.train && !data.train->synthetic()) fmt::print(out, "data: {}\n", data.train->describe());

  // A progress line on a terminal only, overwritten in place.
  const bool progress = isatty(fileno(stderr)) != 0;
  const SearchResult search = search_max_batch(
      [&](int64_t batch) {
        if (progress) fmt::print(stderr, "\r\033[Ktrial: batch {} ...", batch);
        return runner.run(TrialOptions()
                              .batch_size(batch)
                              .steps(kSearchTimedSteps)
                              .warmup_steps(kSearchWarmupSteps));
      },
      options, steady_clock(),
      [&](const TrialResult& trial, size_t index) {
        if (progress) fmt::print(stderr, "\r\033[K{}", trial_progress_line(trial, index));
      });
  if (progress) fmt::print(stderr, "\r\033[K");
  print_search(out, search);

  TuneReport report;
  report.workload = resolved.workload->model().describe();
  report.device = resolved.memory->device().str();
  report.threads = resolved.threads;
  report.search = search;
  report.objective = objective;
  report.capacity_bytes = resolved.memory->capacity_bytes();
  report.usable_bytes = resolved.memory->usable_bytes();
  report.margin = flags.margin;
  if (!flags.search_only && search.max_batch_size > 0) {
    const auto grid = sweep_grid(search.max_batch_size);
    fmt::print(out, "\nsweep: timing {} batch sizes up to {}\n", grid.size(),
               search.max_batch_size);
    report.sweep = run_sweep(
        [&](const TrialOptions& options) {
          if (progress) fmt::print(stderr, "\r\033[Ksweep: batch {} ...", options.batch_size());
          const double t0 = monitor.now_s();
          TrialResult trial = runner.run(options);
          attach_readings(monitor, device, t0, monitor.now_s(), trial);
          return trial;
        },
        grid, search.trials);
    if (progress) fmt::print(stderr, "\r\033[K");
    if (const auto flops = resolved.workload->model().forward_flops_per_sample()) {
      add_flops(report.sweep, *flops);
    }
    if (!report.sweep.empty()) {
      report.selection = select_batch(report.sweep, report.objective, flags.tolerance);
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
  std::optional<Plan> plan;
  LoaderTuning loader;
  if (!flags.search_only && report.selection.batch_size > 0) {
    plan = resolve_plan(flags.plan, cmd, *resolved.workload, *resolved.memory, flags.max_batch,
                        report.selection.batch_size,
                        fmt::format("micro-batch {}: {}", report.selection.batch_size,
                                    report.selection.reason));
    // The input pipeline, timed on the data at the chosen micro-batch.
    const auto row = std::find_if(report.sweep.begin(), report.sweep.end(),
                                  [&](const auto& r) { return r.batch_size == plan->micro_batch_size; });
    loader = data.train ? tune_loader(runner, *data.train,
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

  if (!flags.report.empty()) {
    write_file_atomically(flags.report, html_report(report));
    fmt::print(out, "report: {}\n", flags.report);
  }
  nlohmann::json json = flags.search_only ? to_json(search) : to_json(report);
  if (plan) json["plan"] = to_json(*plan);
  if (!flags.search_only) {
    json["loader"] = to_json(loader.rows);
    json["loader_note"] = loader.note;
  }
  json["complete"] = true;
  if (!flags.json.empty()) write_json_output(flags.json, json);
  return 0;
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
                  "throughput (smallest batch within --tolerance of the fastest) or max-fit")
      ->capture_default_str();
  cmd->add_option("--tolerance", flags->tolerance,
                  "share of the best throughput within which the smallest batch is chosen")
      ->capture_default_str();
  cmd->add_option("--report", flags->report, "write an HTML report with plots to FILE");
  cmd->add_option("--json", flags->json, "write the result as JSON to FILE, or - for stdout");
  // The plan's flags; tune itself finds the micro-batch (see run_tune).
  add_plan_flags(*cmd, flags->plan);
  return [flags, cmd] { return run_tune(*flags, *cmd); };
}

}  // namespace batchtune::cli
