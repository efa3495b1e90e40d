#include "batchtune/tuning/tune.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <limits>
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
#include "batchtune/step/workload.h"

namespace batchtune {
namespace {

// Search trials: one untimed step (it allocates the optimizer state, which
// must be counted) and one timed step.
constexpr int64_t kSearchWarmupSteps = 1;
constexpr int64_t kSearchTimedSteps = 1;
/// A search that starts after its share is spent still gets this share of
/// it (a few trials).
constexpr double kLateSearchShare = 0.1;

/// The measuring run's micro-batch at most: the noise scale does not depend
/// on the batch sizes it is measured at, only its spread does, and a short
/// run at a large micro-batch would take minutes on a CPU.
constexpr int64_t kNoiseRunMaxMicroBatch = 64;
/// ... and at least this, where it fits: at micro-batches of 1 or 2 a run of
/// a few dozen steps often left the smoothed |G|² estimate negative
/// (Fashion-MNIST, mlp, 20 steps of 2 x 4), so no noise scale at all.
constexpr int64_t kNoiseRunMinMicroBatch = 8;

/// Thrown inside the pipeline when the stop request says so; caught in
/// `tune`, which keeps what was measured.
struct Stopped {
  std::string why;
};

/// The time budget, phase by phase: each phase gets its share of the whole
/// plus what the phases before it left unused.
class Budget {
 public:
  Budget(const Clock& clock, double total_s) : clock_(clock), total_s_(total_s) {
    start_s_ = clock_.now_s();
  }
  /// Seconds phase `share` may spend from now.
  double begin_phase(double share) {
    phase_start_s_ = clock_.now_s();
    granted_s_ += share * total_s_;
    return std::max(0.0, start_s_ + granted_s_ - phase_start_s_);
  }
  bool phase_over() const { return clock_.now_s() >= start_s_ + granted_s_; }
  double phase_seconds() const { return clock_.now_s() - phase_start_s_; }
  double elapsed_s() const { return clock_.now_s() - start_s_; }

 private:
  const Clock& clock_;
  double total_s_;
  double start_s_ = 0;
  double phase_start_s_ = 0;
  double granted_s_ = 0;
};

/// What an interrupted tune keeps: the trials it finished, the largest that
/// fitted as the answer, and a sweep row per batch size timed so far.
void keep_partial_results(TuneResult& result, const std::vector<TrialResult>& searched,
                          const std::vector<TrialResult>& swept, SearchStrategy strategy,
                          const std::string& why) {
  result.complete = false;
  result.interrupted_by = why;
  if (result.search.trials.empty()) {  // stopped during the search
    result.search.strategy = strategy;
    result.search.trials = searched;
    for (const auto& t : searched) {
      if (t.fits) result.search.max_batch_size = std::max(result.search.max_batch_size, t.batch_size);
      result.search.steps += t.steps_run;
    }
    result.search.stop_reason = "interrupted by " + why;
  }
  if (result.sweep.empty()) {
    // The last timing of each size wins, as in a finished sweep.
    std::map<int64_t, SweepRow> rows;
    for (const auto& t : swept) {
      if (t.fits) rows[t.batch_size] = sweep_row(t);
    }
    for (const auto& [batch, row] : rows) result.sweep.push_back(row);
  }
}

void check_energy_readable(Objective objective, const std::string& sampler_reason) {
  if (objective != Objective::kEnergy) return;
  if (sampler_reason.find("energy") != std::string::npos &&
      sampler_reason.find("power") != std::string::npos) {
    throw OptionError(Option::kObjective,
                      fmt::format("energy: {}; use {} throughput or goodput here",
                                  energy_unavailable_note(sampler_reason),
                                  mention(Option::kObjective)));
  }
}

/// The energy note, and for `energy` the selection by Zeus cost.
void apply_energy(TuneResult& result, double eta, const std::string& sampler_reason) {
  result.eta = eta;
  const bool all = !result.sweep.empty() &&
                   std::all_of(result.sweep.begin(), result.sweep.end(),
                               [](const SweepRow& r) { return r.energy_j_per_sample.has_value(); });
  result.energy_note = all ? std::string() : energy_unavailable_note(sampler_reason);
  if (result.objective == Objective::kEnergy && !result.sweep.empty()) {
    result.energy_costs = energy_costs(result.sweep, eta);
    result.selection = select_energy(result.sweep, eta, sampler_reason);
    result.selection.confidence = rows_confidence(result.sweep);
  }
}

/// For `goodput`: the noise scale measured on `data` near the throughput
/// choice, the candidates and the choice; returns the global batch to plan.
int64_t apply_goodput(TuneResult& result, const TuneOptions& options, Workload& workload,
                      DeviceMemory& memory, const Dataset& data, double seconds) {
  int64_t largest = 0;
  int64_t smallest = result.sweep.front().batch_size;
  for (const auto& row : result.sweep) {
    largest = std::max(largest, row.batch_size);
    smallest = std::min(smallest, row.batch_size);
  }
  const int64_t micro =
      std::min(std::max(result.selection.batch_size, std::min(kNoiseRunMinMicroBatch, largest)),
               kNoiseRunMaxMicroBatch);
  const double lr = options.plan().base_lr.value_or(workload.options().lr());
  // The run stops at its share of the budget, as the phase line promises.
  result.noise = measure_noise_scale(workload, memory, data, micro, lr, options.noise_steps(),
                                     options.seed(), std::max(seconds, 1e-9), options.clock());
  result.noise_data = data.describe();
  // B0: the batch the lr belongs to, as the plan scales it; else the
  // smallest measured.
  result.goodput_base_batch = lr_base_batch(options.plan()).value_or(smallest);
  const NoiseScaleMeasurement& noise = *result.noise;
  // Unbounded noise makes every batch equally efficient: goodput is throughput.
  const double noise_scale = noise.noise_scale.value_or(std::numeric_limits<double>::infinity());
  result.goodput = goodput_candidates(result.sweep, noise_scale, result.goodput_base_batch,
                                      data.size());
  const GoodputChoice choice = select_goodput(result.goodput, noise_scale, result.goodput_base_batch);
  result.goodput_choice = choice.chosen;
  result.selection = {choice.chosen.micro_batch_size,
                      noise.noise_scale
                          ? choice.reason
                          : "goodput: noise scale unbounded (" + noise.note +
                                "), so every batch is equally efficient; " + choice.reason};
  result.selection.confidence = rows_confidence(result.sweep);
  return choice.chosen.global_batch_size;
}

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
  /// `fixed_amp`: the subject's own precision, nothing to resolve.
  Pipeline(const RunnerAt& runner_at, DeviceMemory& memory, const TuneOptions& options,
           TuneReporter* reporter, Workload* workload, std::optional<AmpChoice> fixed_amp)
      : runner_at_(runner_at),
        memory_(memory),
        fixed_amp_(std::move(fixed_amp)),
        options_(options),
        reporter_(reporter != nullptr ? *reporter : silent_),
        workload_(workload),
        clock_(options.clock() != nullptr ? *options.clock() : steady_clock()),
        budget_(clock_, options.time_budget_s()) {}

  ~Pipeline() {
    for (auto& [runner, clock] : clocks_) runner->set_clock(*clock);
  }

  TuneResult run() {
    validate(options_);
    TuneResult& r = result_;
    DeviceMemory& memory = memory_;
    r.device = memory.device().str();
    r.threads = at::get_num_threads();
    r.objective = options_.objective();
    r.capacity_bytes = memory.capacity_bytes();
    r.usable_bytes = memory.usable_bytes();
    r.margin = options_.margin();
    r.search_only = options_.search_only();
    r.time_budget_s = options_.time_budget_s();
    r.command_line = options_.command_line();
    try {
      precision();
      search();
      if (!r.search_only && r.search.max_batch_size > 0) {
        lengths();
        sweep();
        choose();
        evaluation();
        plan();
      }
    } catch (const Stopped& stopped) {
      keep_partial_results(r, searched_, swept_, options_.search().strategy(), stopped.why);
    } catch (const Interrupted&) {
      // A signal inside a phase that polls it itself (the noise run, loader tuning).
      keep_partial_results(r, searched_, swept_, options_.search().strategy(), interrupt_name());
    }
    if (r.workload.empty()) r.workload = runner_at_(AmpMode::kOff).subject().describe();
    finish_monitor();
    const double elapsed = budget_.elapsed_s();
    if (elapsed > r.time_budget_s * (1 + kTimeBudgetTolerance) && !r.phase_seconds.empty()) {
      const auto longest = std::max_element(
          r.phase_seconds.begin(), r.phase_seconds.end(),
          [](const auto& a, const auto& b) { return a.second < b.second; });
      r.budget_note = fmt::format(
          "the run took {:.1f} s against a time budget of {:.0f} s, the {} phase {:.1f} s of "
          "it: a trial's least measurement (its warm-up and one timed step) or a phase that is "
          "not sliced (the noise run) outlasted what was left; give a larger --time-budget",
          elapsed, r.time_budget_s, to_string(longest->first), longest->second);
    }
    reporter_.finished(r);
    return std::move(r);
  }

 private:
  void check_stop() {
    if (!options_.stop()) return;
    if (auto why = options_.stop()()) throw Stopped{*why};
  }

  /// The runner at `amp`, timing its steps on the tune's clock.
  TrialRunner& runner_at(AmpMode amp) {
    TrialRunner& runner = runner_at_(amp);
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
    if (fixed_amp_) {
      choice = *fixed_amp_;
    } else if (requested != AmpMode::kAuto || memory_.device().is_cuda()) {
      choice = resolve_amp_unmeasured(requested, memory_.device());
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
      throw OptionError(Option::kMemoryLimit, no_fit_message(found, memory_, options_.margin()));
    }
    result_.search = std::move(found);
    end_phase(TunePhase::kSearch);
  }

  /// A length range: the search measured at the longest length; trials at
  /// shorter ones fit the memory model, and the token budget is planned and
  /// checked. Within what the search's share left.
  void lengths() {
    if (workload_ == nullptr) return;
    const auto range = length_range(workload_->input_spec());
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
    const int64_t gradient_reserve = parameter_bytes(workload_->model());
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
    if (workload_ != nullptr) {
      if (const auto flops = workload_->model().forward_flops_per_sample()) {
        add_flops(result_.sweep, *flops);
      }
    }
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
                     fmt::format("max-batch-bound: the search stopped at {}, the --max-batch cap, "
                                 "before memory ran out; raise --max-batch to try larger batches",
                                 options_.search().max_batch())};
    }
    end_phase(TunePhase::kSweep);
    if (r.objective == Objective::kGoodput) {
      const double seconds = budget_.begin_phase(kNoiseBudgetShare);
      check_stop();
      const Dataset* data = options_.data();
      if (workload_ == nullptr) {
        throw OptionError(Option::kObjective,
                          "goodput: needs the workload's own training loop (a C++ Workload)");
      }
      if (data == nullptr) {
        throw OptionError(Option::kObjective, "goodput: needs float inputs to train on; use --data");
      }
      reporter_.phase_started(TunePhase::kNoise,
                              fmt::format("noise scale: training {} steps on {} (at most {:.0f} s)",
                                          options_.noise_steps(), data->describe(), seconds));
      goodput_global_batch_ = apply_goodput(r, options_, *workload_, memory_, *data, seconds);
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

  void plan() {
    TuneResult& r = result_;
    if (r.selection.batch_size < 1) return;
    PlanRequest request = options_.plan();
    request.micro_batch_size.reset();
    request.plan_file.clear();
    if (options_.data_parallel() != nullptr) request.world_size = options_.data_parallel()->world_size();
    const std::string micro_reason = micro_batch_reason(
        r.selection.batch_size, r.selection.reason, own_max_batch_, r.search.max_batch_size);
    const AmpChoice amp{r.amp, r.amp_reason};
    MicroBatchChoice micro{r.selection.batch_size, micro_reason, {}, options_.tolerance()};
    for (const SweepRow& row : r.sweep) {
      if (row.samples_per_s > 0) micro.speeds.push_back({row.batch_size, row.samples_per_s});
    }
    PlanRequest planned = request;
    if (goodput_global_batch_ > 0) planned.target_batch = goodput_global_batch_;
    Plan plan = workload_ != nullptr
                    ? build_plan(planned, micro, amp, *workload_, memory_)
                    : build_subject_plan(planned, micro, amp, memory_.device().is_cuda());
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
    if (options_.data_parallel() != nullptr) plan = options_.data_parallel()->agree_plan(plan);
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
    if (data == nullptr || workload_ == nullptr) {
      r.loader = {{}, {}, "loader tuning skipped: the data are synthetic"};
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
      r.utilization_note += " (why: utilization_details in --json)";
    }
  }

  const RunnerAt& runner_at_;
  DeviceMemory& memory_;
  std::optional<AmpChoice> fixed_amp_;
  TrialRunner* runner_ = nullptr;  // at the resolved precision
  std::map<TrialRunner*, const Clock*> clocks_;  // each runner's own, put back at the end
  const TuneOptions& options_;
  TuneReporter silent_;
  TuneReporter& reporter_;
  Workload* workload_;
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

void validate(const TuneOptions& options) {
  if (options.search().max_batch() > kMaxPlanCount) {
    throw OptionError(Option::kMaxBatch, fmt::format("must be at most {}, got {}", kMaxPlanCount,
                                                     options.search().max_batch()));
  }
  check_margin(options.margin());
  if (!(options.time_budget_s() >= kMinTimeBudgetSeconds)) {
    throw OptionError(Option::kTimeBudget,
                      fmt::format("must be at least {:.0f} s, got {}; a tune needs time for its "
                                  "precision, search and sweep",
                                  kMinTimeBudgetSeconds, options.time_budget_s()));
  }
  if (!(options.tolerance() >= 0 && options.tolerance() < 1)) {
    throw OptionError(Option::kTolerance,
                      fmt::format("must be at least 0 and below 1, got {}", options.tolerance()));
  }
  if (!(options.eta() >= 0 && options.eta() <= 1)) {
    throw OptionError(Option::kEta,
                      fmt::format("must be between 0 (time only) and 1 (energy only), got {}",
                                  options.eta()));
  }
  if (options.noise_steps() < 1 || options.noise_steps() > kMaxNoiseRunSteps) {
    throw OptionError(Option::kNoiseSteps, fmt::format("must be from 1 to {}, got {}",
                                                       kMaxNoiseRunSteps, options.noise_steps()));
  }
  if (options.objective() == Objective::kGoodput && options.plan().target_batch) {
    throw OptionError(Option::kTargetBatch,
                      fmt::format("{0} goodput chooses the global batch itself; leave {1} out, or "
                                  "use {0} throughput with it",
                                  mention(Option::kObjective), mention(Option::kTargetBatch)));
  }
  validate(options.plan());
  if (options.monitor() != nullptr) {
    check_energy_readable(options.objective(), options.monitor()->sampler().unavailable_reason());
  }
}

std::string to_string(TunePhase phase) {
  switch (phase) {
    case TunePhase::kPrecision: return "precision";
    case TunePhase::kSearch: return "search";
    case TunePhase::kLengths: return "lengths";
    case TunePhase::kSweep: return "sweep";
    case TunePhase::kNoise: return "noise";
    case TunePhase::kEval: return "eval";
    case TunePhase::kLoader: return "loader";
    case TunePhase::kPlan: return "plan";
  }
  return "?";
}

TuneResult tune(const RunnerAt& runner_at, DeviceMemory& memory, const TuneOptions& options,
                TuneReporter* reporter, Workload* workload) {
  return Pipeline(runner_at, memory, options, reporter, workload, std::nullopt).run();
}

TuneResult tune(TrialRunner& runner, const TuneOptions& options, TuneReporter* reporter,
                Workload* workload) {
  const RunnerAt same = [&](AmpMode) -> TrialRunner& { return runner; };
  const AmpChoice own{runner.amp(), "amp " + amp_name(runner.amp()) + ": the subject's precision",
                      1.0};
  TuneOptions resolved = options;
  resolved.margin(runner.margin());
  return Pipeline(same, runner.memory(), resolved, reporter, workload, own).run();
}

TuneResult tune(Workload& workload, DeviceMemory& memory, const TuneOptions& options,
                TuneReporter* reporter) {
  validate(options);
  // One runner per precision the pipeline asks for, made when it asks.
  std::map<AmpMode, std::unique_ptr<TrialRunner>> runners;
  const RunnerAt runner_at = [&](AmpMode amp) -> TrialRunner& {
    auto& runner = runners[amp];
    if (!runner) runner = std::make_unique<TrialRunner>(workload, memory, options.margin(), amp);
    return *runner;
  };
  return tune(runner_at, memory, options, reporter, &workload);
}

TuneOptions quick_tune_options(const PlanRequest& request, int64_t max_batch) {
  return TuneOptions()
      .search(SearchOptions().max_batch(std::min(max_batch, kDefaultMaxBatch)))
      .time_budget_s(kQuickTuneTimeBudgetSeconds)
      .amp(request.amp.value_or(AmpMode::kAuto))
      .plan(request);
}

Plan resolve_plan(const PlanRequest& request, Workload& workload, DeviceMemory& memory,
                  int64_t max_batch, TuneReporter* reporter, DataParallel* data_parallel,
                  StopRequest stop) {
  validate(request);
  const PlanWorkload current = describe_workload(workload, memory, request);
  if (!request.plan_file.empty()) {
    const Plan file = read_plan_file(request.plan_file);
    const std::string source = "--plan " + request.plan_file;
    check_plan_workload(file.workload, current, source);
    AmpChoice amp{file.amp, fmt::format("amp {}: from the plan {}", amp_name(file.amp),
                                        request.plan_file)};
    if (request.amp) {
      amp = choose_amp(*request.amp, workload, memory,
                       std::min(request.micro_batch_size.value_or(file.micro_batch_size),
                                kAmpProbeMaxBatch));
      if (amp.mode != file.amp) {
        amp.reason += fmt::format(" (--amp overrides the plan's {})", amp_name(file.amp));
      }
    }
    const int64_t micro = request.micro_batch_size.value_or(file.micro_batch_size);
    const std::string micro_reason =
        request.micro_batch_size
            ? fmt::format("micro-batch {}: as asked with --batch-size (the plan {} has {})", micro,
                          request.plan_file, file.micro_batch_size)
            : fmt::format("micro-batch {}: from the plan {}", micro, request.plan_file);
    Plan plan = build_plan(request, {micro, micro_reason}, amp, workload, memory);
    if (file.eval_micro_batch_size > 0 && amp.mode == file.amp) {
      // Measured at the file's precision: at another, evaluation runs at
      // the micro-batch.
      plan.eval_micro_batch_size = std::max(file.eval_micro_batch_size, plan.micro_batch_size);
      plan.set_reason(PlanField::kEvalBatch,
                      fmt::format("eval batch {}: from the plan {}", plan.eval_micro_batch_size,
                                  request.plan_file));
    }
    if (file.token_budget > 0) {
      plan.token_budget = file.token_budget;
      plan.length_buckets = file.length_buckets;
      plan.set_reason(PlanField::kTokenBudget,
                      fmt::format("token budget {}: from the plan {}", file.token_budget,
                                  request.plan_file));
    }
    return plan;
  }
  if (request.micro_batch_size) {
    const int64_t micro = *request.micro_batch_size;
    const AmpChoice amp = choose_amp(request.amp.value_or(AmpMode::kAuto), workload, memory,
                                     std::min(micro, kAmpProbeMaxBatch));
    return build_plan(request, {micro, fmt::format("micro-batch {}: as asked with --batch-size", micro)},
                      amp, workload, memory);
  }
  // Neither: a quick tune finds the micro-batch at the precision it trains with.
  TuneOptions options = quick_tune_options(request, max_batch);
  options.data_parallel(data_parallel).stop(std::move(stop));
  TuneResult tuned = tune(workload, memory, options, reporter);
  if (!tuned.complete) throw Interrupted();
  if (!tuned.plan) {
    throw OptionError(Option::kBatchSize,
                      fmt::format("the quick tune found no micro-batch ({}); give one",
                                  tuned.search.stop_reason));
  }
  Plan plan = *tuned.plan;
  if (plan.micro_batch_size == tuned.selection.batch_size) {
    plan.set_reason(PlanField::kMicroBatch,
                    fmt::format("micro-batch {}: tuned — largest that fits {} ({}); {}",
                                plan.micro_batch_size, tuned.search.max_batch_size,
                                tuned.search.stop_reason, tuned.selection.reason));
  }
  return plan;
}

}  // namespace batchtune
