#include "batchtune/tuning/tune.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>

#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/common/option.h"
#include "batchtune/common/size.h"
#include "batchtune/data/dataset.h"
#include "batchtune/distributed/data_parallel.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/monitoring/monitor.h"
#include "batchtune/monitoring/sampler.h"
#include "partial_results.h"
#include "tune_budget.h"
#include "tune_objectives.h"

namespace batchtune {
namespace {

// Search trials: one untimed step (it allocates the optimizer state, which
// must be counted) and one timed step.
constexpr int64_t kSearchWarmupSteps = 1;
constexpr int64_t kSearchTimedSteps = 1;
/// A search that starts after its share is spent still gets this share of
/// it (a few trials).
constexpr double kLateSearchShare = 0.1;

/// Thrown inside the pipeline when the stop request says so; caught in
/// `tune`, which keeps what was measured.
struct Stopped {
  std::string why;
};

/// Bad input, not a result: the workload does not fit at all. Says how much
/// the smallest batch tried needed.
std::string no_fit_message(const SearchResult& search, const DeviceMemory& memory, double margin) {
  const auto smallest = std::min_element(
      search.trials.begin(), search.trials.end(),
      [](const TrialResult& a, const TrialResult& b) { return a.batch_size < b.batch_size; });
  std::string needed = fmt::format("its peak reached {}", format_bytes(smallest->peak_bytes));
  if (!smallest->error.empty()) needed += ": " + first_line(smallest->error);
  return fmt::format(
      "not even batch {} fits in the {} usable ({} capacity less the {:.0f} % margin); {}; give a "
      "larger {}, a smaller {} or a smaller model",
      smallest->batch_size, format_bytes(memory.usable_bytes()),
      format_bytes(memory.capacity_bytes()), 100 * margin, needed, mention(Option::kMemoryLimit),
      mention(Option::kMargin));
}

/// The tune: the precision first, then everything at that precision.
class Pipeline {
 public:
  Pipeline(TuneSubject& subject, DeviceMemory& memory, const ResolvedTuneOptions& options,
           TuneReporter* reporter)
      : subject_(subject),
        memory_(memory),
        options_(*options),
        reporter_(reporter != nullptr ? *reporter : silent_),
        clock_(options->clock() != nullptr ? *options->clock() : steady_clock()),
        budget_(clock_, options->time_budget_s()) {}

  ~Pipeline() {
    for (auto& [runner, clock] : clocks_) runner->set_clock(*clock);
  }

  TuneResult run() {
    TuneResult& r = result_;
    DeviceMemory& memory = memory_;
    r.device = memory.device().str();
    r.threads = at::get_num_threads();
    r.objective = options_.objective();
    r.capacity_bytes = memory.capacity_bytes();
    r.usable_bytes = memory.usable_bytes();
    r.margin = subject_.own_margin().value_or(options_.margin());
    r.search_only = options_.search_only();
    r.time_budget_s = options_.time_budget_s();
    r.command_line = options_.command_line();
    try {
      precision();
      search();
      if (!r.search_only && r.search.max_batch_size > 0) {
        lengths();
        if (options_.sweep()) {
          sweep();
          choose();
          evaluation();
        } else {
          take_the_largest();
        }
        plan();
      }
    } catch (const Stopped& stopped) {
      keep_partial_results(r, searched_, swept_, options_.search().strategy(), stopped.why);
    } catch (const Interrupted&) {
      // A signal inside a phase that polls it itself (the noise run, loader
      // tuning, a trial of a subject that polls): named as the stop request
      // names it (Python's KeyboardInterrupt), else as the signal.
      std::optional<std::string> why = options_.stop() ? options_.stop()() : std::nullopt;
      keep_partial_results(r, searched_, swept_, options_.search().strategy(),
                           why.value_or(interrupt_name()));
    }
    if (r.workload.empty()) r.workload = subject_.runner(AmpMode::kOff).subject().describe();
    finish_monitor();
    const double elapsed = budget_.elapsed_s();
    if (elapsed > r.time_budget_s * (1 + kTimeBudgetTolerance) && !r.phase_seconds.empty()) {
      const auto longest = std::max_element(
          r.phase_seconds.begin(), r.phase_seconds.end(),
          [](const auto& a, const auto& b) { return a.second < b.second; });
      r.budget_note = fmt::format(
          "the run took {:.1f} s against a time budget of {:.0f} s, the {} phase {:.1f} s of "
          "it: a trial's least measurement (its warm-up and one timed step) or a phase that is "
          "not sliced (the noise run) outlasted what was left; give a larger {}",
          elapsed, r.time_budget_s, to_string(longest->first), longest->second,
          name(Option::kTimeBudget));
    }
    reporter_.finished(r);
    return std::move(r);
  }

 private:
  /// `option` as the caller's front end names it.
  std::string name(Option option) const { return option_name(option, options_.front_end()); }

  void check_stop() {
    if (!options_.stop()) return;
    if (auto why = options_.stop()()) throw Stopped{*why};
  }

  /// The runner at `amp`, timing its steps on the tune's clock.
  TrialRunner& runner_at(AmpMode amp) {
    TrialRunner& runner = subject_.runner(amp);
    if (clocks_.count(&runner) == 0) {
      clocks_[&runner] = &runner.clock();
      runner.set_clock(clock_);
    }
    return runner;
  }

  /// The precision every trial runs at, inside the budget: as asked, by
  /// the GPU's capability, or on the CPU measured (bf16 against fp32).
  void precision() {
    TuneResult& r = result_;
    const double seconds = budget_.begin_phase(kPrecisionBudgetShare);
    AmpChoice choice;
    const AmpMode requested = options_.amp();
    if (const auto own = subject_.own_amp()) {
      choice = *own;
    } else if (requested != AmpMode::kAuto || memory_.device().is_cuda()) {
      choice = resolve_amp_unmeasured(requested, memory_.device());
      if (requested != AmpMode::kAuto) {
        // As asked, in the caller's words ("as asked with amp", or where the
        // value came from: "the Trainer's precision 'bf16-mixed'").
        choice.reason = fmt::format("amp {}: {}", amp_name(requested),
                                    as_asked(Option::kAmp, options_.front_end(),
                                             options_.plan().sources));
      }
    } else {
      reporter_.phase_started(
          TunePhase::kPrecision,
          fmt::format("amp auto: timing bf16 against fp32, interleaved (at most {:.0f} s)",
                      seconds));
      AmpMeasureOptions measure;
      measure.clock = &clock_;
      measure.deadline_s = clock_.now_s() + seconds;
      double t0 = 0;
      measure.before_trial = [&](AmpMode, int64_t batch) {
        check_stop();
        reporter_.trial_started(TunePhase::kPrecision, batch);
        if (options_.monitor() != nullptr) t0 = options_.monitor()->now_s();
      };
      size_t index = 0;
      measure.after_trial = [&](const TrialResult& t) {
        if (options_.monitor() != nullptr) {
          result_.phases.push_back({t0 - monitor_start_s_, options_.monitor()->now_s() - monitor_start_s_,
                                    t.batch_size, to_string(TunePhase::kPrecision)});
        }
        reporter_.trial_finished(TunePhase::kPrecision, t, index++);
      };
      choice = measure_cpu_amp(runner_at(AmpMode::kOff), runner_at(AmpMode::kBf16), measure);
    }
    DataParallel* data_parallel = options_.data_parallel();
    if (data_parallel != nullptr && data_parallel->distributed()) {
      // Rank 0's precision for every rank: one job trains at one precision.
      const auto rank0 = static_cast<AmpMode>(data_parallel->min(
          data_parallel->rank() == 0 ? static_cast<int64_t>(choice.mode) : INT64_MAX));
      if (rank0 != choice.mode) {
        choice = {rank0, fmt::format("amp {}: rank 0's choice (this rank's: {})", amp_name(rank0),
                                     choice.reason),
                  choice.confidence};
      }
    }
    r.amp = choice.mode;
    r.amp_reason = choice.reason;
    r.amp_confidence = choice.confidence;
    runner_ = &runner_at(choice.mode);
    r.workload = runner_->subject().describe();
    end_phase(TunePhase::kPrecision);
  }

  TrialResult trial(TunePhase phase, const TrialOptions& trial_options) {
    check_stop();
    reporter_.trial_started(phase, trial_options.batch_size());
    const double t0 = options_.monitor() != nullptr ? options_.monitor()->now_s() : 0;
    // The runner stamps its timed window on its own clock; the monitor's
    // samples are on the monitor's.
    const double offset = t0 - runner_->clock().now_s();
    TrialResult result = runner_->run(trial_options);
    if (options_.monitor() != nullptr) {
      const double t1 = options_.monitor()->now_s();
      attach_readings(*options_.monitor(), result_.device, offset, result);
      result_.phases.push_back({t0 - monitor_start_s_, t1 - monitor_start_s_,
                                trial_options.batch_size(), to_string(phase)});
    }
    return result;
  }

  void end_phase(TunePhase phase) {
    result_.phase_seconds.emplace_back(phase, budget_.phase_seconds());
    reporter_.phase_finished(phase, result_);
  }

  void search() {
    SearchOptions search = options_.search();
    // Never nothing, even when the precision phase overran its share on a
    // loaded machine: what fits is the answer a tune cannot go without (the
    // overrun is then said in `budget_note`).
    const double seconds =
        std::max(budget_.begin_phase(kSearchBudgetShare),
                 kLateSearchShare * kSearchBudgetShare * options_.time_budget_s());
    search.time_budget_s(seconds);
    // No micro-batch larger than the training data.
    const Dataset* data = options_.data();
    if (data != nullptr && !data->synthetic()) {
      search.max_batch(std::min(search.max_batch(), data->size()));
    }
    reporter_.phase_started(TunePhase::kSearch,
                            fmt::format("searching the largest batch that fits ({}, at most {:.0f} s)",
                                        to_string(search.strategy()), seconds));
    SearchResult found = search_max_batch(
        [&](int64_t batch) {
          return trial(TunePhase::kSearch, TrialOptions()
                                               .batch_size(batch)
                                               .steps(kSearchTimedSteps)
                                               .warmup_steps(kSearchWarmupSteps));
        },
        search, clock_,
        [&](const TrialResult& t, size_t index) {
          searched_.push_back(t);
          reporter_.trial_finished(TunePhase::kSearch, t, index);
        });
    if (options_.data_parallel() != nullptr && options_.data_parallel()->distributed()) {
      // The job's largest micro-batch is the smallest rank's: each rank
      // searched alone (no collective inside a trial, so an out-of-memory
      // never leaves a rank waiting), and the minimum counts every one.
      own_max_batch_ = found.max_batch_size;
      result_.rank_max_batch_size = own_max_batch_;
      found.max_batch_size = options_.data_parallel()->min(found.max_batch_size);
    }
    // Not even batch 1 fitting is bad input, not a result: said before any table.
    if (found.max_batch_size < 1 && !found.trials.empty()) {
      throw OptionError(Option::kMemoryLimit, no_fit_message(found, memory_, result_.margin));
    }
    result_.search = std::move(found);
    end_phase(TunePhase::kSearch);
  }

  /// A length range: the search measured at the longest length; trials at
  /// shorter ones fit the memory model, and the token budget is planned and
  /// checked. Within what the search's share left.
  void lengths() {
    const auto range = subject_.length_range();
    if (!range) return;
    budget_.begin_phase(0);
    reporter_.phase_started(
        TunePhase::kLengths,
        fmt::format("lengths {}..{}: peak memory against batch x length, for a token budget",
                    range->min, range->max));
    size_t index = 0;
    // A trial measures one micro-batch from no gradients; accumulating a
    // step's micro-batches holds the gradients of those before (one copy
    // of the parameters), so the budget is planned without them.
    const int64_t gradient_reserve = subject_.gradient_bytes();
    result_.tokens = plan_token_budget(
        [&](int64_t batch, int64_t length) {
          TrialResult t = trial(TunePhase::kLengths, TrialOptions()
                                                         .batch_size(batch)
                                                         .sequence_length(length)
                                                         .steps(kSearchTimedSteps)
                                                         .warmup_steps(kSearchWarmupSteps));
          reporter_.trial_finished(TunePhase::kLengths, t, index++);
          return t;
        },
        result_.search.trials, result_.search.max_batch_size, *range,
        memory_.usable_bytes() - gradient_reserve, options_.search().max_batch());
    result_.tokens->reason += fmt::format(
        "; {} kept free for the gradients held while micro-batches accumulate",
        format_bytes(gradient_reserve));
    end_phase(TunePhase::kLengths);
  }

  void sweep() {
    const double seconds = budget_.begin_phase(kSweepBudgetShare);
    std::vector<int64_t> grid = sweep_grid(result_.search.max_batch_size);
    // The largest size first: when the budget runs out, the sizes left out
    // are small ones, which throughput rarely favours.
    std::rotate(grid.rbegin(), grid.rbegin() + 1, grid.rend());
    reporter_.phase_started(TunePhase::kSweep,
                            fmt::format("timing {} batch sizes up to {} (at most {:.0f} s)",
                                        grid.size(), result_.search.max_batch_size, seconds));
    size_t index = 0;
    SweepOptions sweep_options;
    sweep_options.clock = &clock_;
    sweep_options.deadline_s = clock_.now_s() + seconds;
    sweep_options.objective = options_.objective();
    sweep_options.tolerance = options_.tolerance();
    const SweepOutcome outcome = run_sweep(
        [&](const TrialOptions& o) {
          TrialResult t = trial(TunePhase::kSweep, o);
          swept_.push_back(t);
          reporter_.trial_finished(TunePhase::kSweep, t, index++);
          return t;
        },
        grid, result_.search.trials, sweep_options);
    result_.sweep = outcome.rows;
    if (outcome.sizes_left_out > 0) {
      sweep_note_ = fmt::format("the sweep's share of the time budget ({:.0f} s) ran out: {} of "
                                "{} sizes timed",
                                seconds, result_.sweep.size(), grid.size());
    }
    if (outcome.remeasure_rounds > 0) {
      remeasure_note_ = fmt::format("the contenders were re-measured, interleaved, {} time(s)",
                                    outcome.remeasure_rounds);
    }
    if (const auto flops = subject_.flops_per_sample()) add_flops(result_.sweep, *flops);
    // The sweep's phase ends in choose(), once its rows are read: the
    // console shows the table with the choice and the diagnosis.
  }

  void choose() {
    TuneResult& r = result_;
    if (r.sweep.empty()) {
      end_phase(TunePhase::kSweep);
      return;
    }
    const bool plain = r.objective == Objective::kThroughput || r.objective == Objective::kMaxFit;
    r.selection = select_batch(r.sweep, plain ? r.objective : Objective::kThroughput,
                               options_.tolerance());
    if (!remeasure_note_.empty()) r.selection.reason += "; " + remeasure_note_;
    if (!sweep_note_.empty()) r.selection.reason += "; " + sweep_note_;
    const std::string sampler_reason =
        options_.monitor() != nullptr ? options_.monitor()->sampler().unavailable_reason()
                                      : "no monitor";
    apply_energy(r, options_.eta(), sampler_reason);
    r.diagnosis = diagnose(r.sweep, r.selection, options_.tolerance());
    // A batch that --max-batch capped says nothing of memory or precision.
    const bool bounded =
        r.diagnosis.kind == "small-batch-bound" || r.diagnosis.kind == "memory-bound";
    if (r.search.hit_max_batch && bounded) {
      r.diagnosis = {"max-batch-bound",
                     fmt::format("max-batch-bound: the search stopped at {0}, the {1} cap, "
                                 "before memory ran out; raise {1} to try larger batches",
                                 options_.search().max_batch(), name(Option::kMaxBatch))};
    }
    end_phase(TunePhase::kSweep);
    if (r.objective == Objective::kGoodput) {
      const double seconds = budget_.begin_phase(kNoiseBudgetShare);
      check_stop();
      const Dataset* data = options_.data();
      if (!subject_.runs_noise()) {
        throw OptionError(Option::kObjective,
                          "goodput: needs the workload's own training loop (a C++ Workload)");
      }
      if (data == nullptr) {
        throw OptionError(Option::kObjective, "goodput: needs float inputs to train on; use --data");
      }
      reporter_.phase_started(TunePhase::kNoise,
                              fmt::format("noise scale: training {} steps on {} (at most {:.0f} s)",
                                          options_.noise_steps(), data->describe(), seconds));
      goodput_global_batch_ = apply_goodput(r, options_, subject_, memory_, *data, seconds);
      end_phase(TunePhase::kNoise);
      check_stop();
    }
  }

  /// The evaluation batch: the largest forward-only batch that fits, found
  /// by the same search, from the chosen micro-batch's precision.
  void evaluation() {
    TuneResult& r = result_;
    const double seconds = budget_.begin_phase(kEvalBudgetShare);
    if (r.selection.batch_size < 1 || seconds <= 0) return;  // the budget is spent
    ForwardOnlyScope forward_only(runner_->subject());
    if (!forward_only.supported()) return;
    check_stop();
    SearchOptions search = options_.search();
    search.time_budget_s(seconds);
    reporter_.phase_started(TunePhase::kEval,
                            fmt::format("searching the largest evaluation batch (forward only, at "
                                        "most {:.0f} s)",
                                        seconds));
    SearchResult found = search_max_batch(
        [&](int64_t batch) {
          return trial(TunePhase::kEval, TrialOptions().batch_size(batch).steps(1).warmup_steps(0));
        },
        search, clock_,
        [&](const TrialResult& t, size_t index) {
          reporter_.trial_finished(TunePhase::kEval, t, index);
        });
    if (options_.data_parallel() != nullptr && options_.data_parallel()->distributed()) {
      found.max_batch_size = options_.data_parallel()->min(found.max_batch_size);
    }
    r.eval_search = std::move(found);
    end_phase(TunePhase::kEval);
  }

  /// No sweep (`TuneOptions::sweep` false): the plan at the largest batch that fits.
  void take_the_largest() {
    result_.selection = {result_.search.max_batch_size, "the largest batch that fits (no sweep)",
                         1.0, {}};
  }

  void plan() {
    TuneResult& r = result_;
    if (r.selection.batch_size < 1) return;
    PlanRequest request = options_.plan();
    request.micro_batch_size.reset();
    request.plan_file.clear();
    // Several processes tuning together plan for their group; one process
    // plans for the world size it was asked for.
    if (options_.data_parallel() != nullptr && options_.data_parallel()->distributed()) {
      request.world_size = options_.data_parallel()->world_size();
    }
    const std::string micro_reason = micro_batch_reason(
        r.selection.batch_size, r.selection.reason, own_max_batch_, r.search.max_batch_size);
    const AmpChoice amp{r.amp, r.amp_reason};
    MicroBatchChoice micro{r.selection.batch_size, micro_reason, {}, options_.tolerance()};
    for (const SweepRow& row : r.sweep) {
      if (row.samples_per_s > 0) micro.speeds.push_back({row.batch_size, row.samples_per_s});
    }
    PlanRequest planned = request;
    if (goodput_global_batch_ > 0) planned.target_batch = goodput_global_batch_;
    Plan plan = subject_.plan(planned, micro, amp, memory_);
    if (goodput_global_batch_ > 0) {
      plan.set_reason(PlanField::kGlobalBatch,
                      plan.accumulation_steps == 1
                          ? fmt::format("global batch {}: the goodput choice, the micro-batch itself",
                                        plan.global_batch_size)
                          : fmt::format("global batch {}: the goodput choice, {} accumulated "
                                        "micro-batches of {}",
                                        plan.global_batch_size, plan.accumulation_steps,
                                        plan.micro_batch_size));
    }
    if (r.eval_search && r.eval_search->max_batch_size > 0) {
      // Evaluation never needs less room than training: at least the micro-batch.
      plan.eval_micro_batch_size =
          std::max(r.eval_search->max_batch_size, plan.micro_batch_size);
      plan.set_reason(PlanField::kEvalBatch,
                      fmt::format("eval batch {}: the largest forward-only batch that fits ({}, "
                                  "{})",
                                  plan.eval_micro_batch_size,
                                  to_string(r.eval_search->strategy), r.eval_search->stop_reason));
    }
    if (r.tokens) {
      plan.token_budget = r.tokens->token_budget;
      plan.length_buckets = r.tokens->buckets;
      plan.set_reason(PlanField::kTokenBudget, r.tokens->reason);
    }
    // The micro-batch this rank's plan took (a smaller one may reach the
    // target exactly): the selection stays this rank's choice unless the
    // job's agreement gives another plan.
    const int64_t planned_micro = plan.micro_batch_size;
    if (options_.data_parallel() != nullptr) plan = options_.data_parallel()->agree_plan(plan);
    if (plan.micro_batch_size != planned_micro) {
      // Data parallel: every rank swept its own device; the job trains rank 0's choice.
      r.selection.reason += fmt::format("; the job takes rank 0's micro-batch {} (this rank chose {})",
                                        plan.micro_batch_size, r.selection.batch_size);
      r.selection.batch_size = plan.micro_batch_size;
    }
    r.plan = plan;
    tune_loader_phase();
    budget_.begin_phase(0);  // the plan's own seconds, not the loader's again
    reporter_.phase_started(TunePhase::kPlan, "the plan");
    end_phase(TunePhase::kPlan);
  }

  void tune_loader_phase() {
    TuneResult& r = result_;
    const double seconds = budget_.begin_phase(kLoaderBudgetShare);
    const Dataset* data = options_.data();
    if (data == nullptr || !subject_.tunes_loader()) {
      r.loader = {{}, {}, subject_.loader_skipped_note()};
      return;
    }
    if (seconds <= 0) {
      r.loader = {{}, {}, "loader tuning skipped: the time budget was spent"};
      return;
    }
    check_stop();
    reporter_.phase_started(TunePhase::kLoader,
                            fmt::format("input pipeline: timing worker counts on {} (at most {:.0f} s)",
                                        data->describe(), seconds));
    Plan& plan = *r.plan;
    const auto row = std::find_if(r.sweep.begin(), r.sweep.end(), [&](const auto& s) {
      return s.batch_size == plan.micro_batch_size;
    });
    r.loader = tune_loader(*runner_, *data, std::min(plan.micro_batch_size, data->size()),
                           row != r.sweep.end() ? row->step_ms / 1000 : 0, plan.prefetch,
                           options_.seed(), std::max<int64_t>(1, options_.cores()),
                           [&] { return budget_.phase_over(); });
    end_phase(TunePhase::kLoader);
    if (r.loader.choice && !options_.plan().workers) apply_loader_choice(plan, *r.loader.choice);
    if (const auto wait = chosen_wait(r.loader); wait && *wait >= kInputBoundWait) {
      r.diagnosis = {"input-bound", input_diagnosis(*wait, r.loader.choice->workers,
                                                    kInputBoundWait, /*loader_tuned=*/true)};
    }
    check_stop();
  }

  void finish_monitor() {
    Monitor* monitor = options_.monitor();
    TuneResult& r = result_;
    if (monitor == nullptr) {
      r.utilization_note = "utilization not monitored";
      return;
    }
    monitor->stop();
    const double start = monitor_start_s_;
    for (const auto& sample : monitor->samples()) {
      // Readings from before the tune began (the monitor may have started
      // earlier) would put the timeline's start below 0.
      if (sample.device == r.device && sample.time_s >= start) {
        r.timeline.push_back({sample.time_s - start, sample.utilization_percent});
      }
    }
    // One short line on the console; the reasons (~400 characters of NVML
    // and RAPL errors) go to utilization_details.
    r.utilization_details = monitor->sampler().describe();
    r.utilization_note = r.utilization_details;
    const std::string missing = monitor->sampler().unavailable_reason();
    if (!missing.empty()) {
      r.utilization_details += "; n/a: " + missing;
      r.utilization_note += "; n/a: " + missing.substr(0, missing.find(": "));
    }
    if (memory_.device().is_cpu()) {
      r.utilization_details += "; GPU utilization unavailable: " + gpu_unavailable_reason();
      r.utilization_note += "; no GPU";
    }
    if (r.utilization_note != r.utilization_details) {
      r.utilization_note += options_.front_end() == FrontEnd::kCli
                                ? " (why: utilization_details in --json)"
                                : " (why: utilization_details in to_dict())";
    }
  }

  TuneSubject& subject_;
  DeviceMemory& memory_;
  TrialRunner* runner_ = nullptr;  // at the resolved precision
  std::map<TrialRunner*, const Clock*> clocks_;  // each runner's own, put back at the end
  const TuneOptions& options_;
  TuneReporter silent_;
  TuneReporter& reporter_;
  const Clock& clock_;
  Budget budget_;
  double monitor_start_s_ = options_.monitor() != nullptr ? options_.monitor()->now_s() : 0;
  TuneResult result_;
  std::vector<TrialResult> searched_;
  std::vector<TrialResult> swept_;
  std::optional<int64_t> own_max_batch_;
  int64_t goodput_global_batch_ = 0;
  std::string sweep_note_;
  std::string remeasure_note_;
};

}  // namespace

TuneResult tune(TuneSubject& subject, DeviceMemory& memory, const ResolvedTuneOptions& options,
                TuneReporter* reporter) {
  return Pipeline(subject, memory, options, reporter).run();
}

TuneResult tune(TuneSubject& subject, DeviceMemory& memory, const TuneOptions& options,
                TuneReporter* reporter) {
  return tune(subject, memory, resolve(options), reporter);
}

TuneResult tune(Workload& workload, DeviceMemory& memory, const TuneOptions& options,
                TuneReporter* reporter) {
  const ResolvedTuneOptions resolved = resolve(options);
  WorkloadSubject subject(workload, memory, resolved->margin());
  return tune(subject, memory, resolved, reporter);
}

TuneResult tune(const RunnerAt& runner_at, DeviceMemory& memory, const TuneOptions& options,
                TuneReporter* reporter) {
  RunnerSubject subject(runner_at);
  return tune(subject, memory, options, reporter);
}

TuneResult tune(TrialRunner& runner, const TuneOptions& options, TuneReporter* reporter) {
  RunnerSubject subject(runner);
  return tune(subject, runner.memory(), options, reporter);
}

}  // namespace batchtune
