#include "batchtune/tuning/loader_tuning.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "batchtune/memory/budget_allocator.h"
#include "batchtune/data/dataset.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "batchtune/data/loader.h"
#include "batchtune/step/trial.h"

namespace batchtune {

std::vector<int64_t> loader_worker_grid(int64_t cores) {
  std::vector<int64_t> grid{0};
  for (int64_t w = 1; w < cores; w *= 2) grid.push_back(w);
  if (cores >= 1) grid.push_back(cores);
  return grid;
}

LoaderChoice choose_loader(const std::vector<LoaderRow>& rows, double max_wait) {
  TORCH_CHECK(!rows.empty(), "choose_loader: no rows");
  const LoaderRow* fastest = &rows.front();
  for (const auto& row : rows) {
    if (row.samples_per_s > fastest->samples_per_s) fastest = &row;
  }
  const double floor = fastest->samples_per_s * (1 - kLoaderThroughputTolerance);
  const LoaderRow* enough = nullptr;
  for (const auto& row : rows) {
    if (row.data_wait_fraction >= max_wait || row.samples_per_s < floor) continue;
    if (enough == nullptr || row.workers < enough->workers ||
        (row.workers == enough->workers && row.samples_per_s > enough->samples_per_s)) {
      enough = &row;
    }
  }
  const auto name = [](const LoaderRow& r) {
    return fmt::format("{} worker{}{}", r.workers, r.workers == 1 ? "" : "s",
                       r.pin_memory ? ", pinned memory" : "");
  };
  if (enough != nullptr) {
    return {enough->workers, enough->pin_memory,
            fmt::format("loader: {}: the fewest that keep the data wait under {:.0f} % of the "
                        "step ({:.1f} %) within {:.0f} % of the fastest ({:.1f} samples/s)",
                        name(*enough), 100 * max_wait, 100 * enough->data_wait_fraction,
                        100 * kLoaderThroughputTolerance, enough->samples_per_s)};
  }
  return {fastest->workers, fastest->pin_memory,
          fmt::format("loader: {}: the fastest measured ({:.1f} samples/s); no setting keeps the "
                      "data wait under {:.0f} % at that speed (here {:.1f} %): the input "
                      "pipeline or the cores are the bottleneck — smaller or pre-resized "
                      "images, or more cores",
                      name(*fastest), fastest->samples_per_s, 100 * max_wait,
                      100 * fastest->data_wait_fraction)};
}

std::vector<LoaderRow> time_loaders(const std::function<LoaderRow(int64_t, bool)>& measure,
                                    const std::vector<int64_t>& grid, bool cuda,
                                    const std::function<bool()>& out_of_time) {
  std::vector<LoaderRow> rows;
  const auto time_left = [&] { return rows.empty() || !out_of_time || !out_of_time(); };
  for (int64_t workers : grid) {
    // Every setting is a second or more of training: a signal stops here.
    throw_if_interrupted();
    if (!time_left()) break;
    rows.push_back(measure(workers, false));
    throw_if_interrupted();
    if (cuda && time_left()) rows.push_back(measure(workers, true));
  }
  return rows;
}

int64_t loader_steps(double step_seconds) {
  if (!(step_seconds > 0)) return kLoaderMinSteps;
  const auto steps = static_cast<int64_t>(std::ceil(kLoaderMinSeconds / step_seconds));
  return std::clamp(steps, kLoaderMinSteps, kLoaderMaxSteps);
}

LoaderRow measure_loader(TrialRunner& runner, const Dataset& data, int64_t batch_size,
                         int64_t workers, bool pin_memory, int64_t prefetch, int64_t steps,
                         uint64_t seed) {
  if (batch_size > data.size()) {
    throw Error(fmt::format("loader tuning: batch {} is larger than the {} samples of {}", batch_size,
                            data.size(), data.describe()));
  }
  // Batches in the order training would take them: an epoch's permutation,
  // cut into batches, the next epoch's after it.
  const int64_t per_epoch = data.size() / batch_size;
  std::vector<int64_t> order;
  int64_t order_epoch = -1;
  Loader loader(
      data,
      [&](int64_t n) -> std::optional<std::vector<int64_t>> {
        const int64_t epoch = n / per_epoch;
        if (epoch != order_epoch) {
          BudgetAllocator::UncountedScope uncounted;
          auto generator = at::make_generator<at::CPUGeneratorImpl>(seed * 7919 + epoch + 1);
          const at::Tensor perm = at::randperm(data.size(), generator, at::kLong);
          order.assign(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + data.size());
          order_epoch = epoch;
        }
        const auto first = order.begin() + (n % per_epoch) * batch_size;
        return std::vector<int64_t>(first, first + batch_size);
      },
      LoaderOptions().workers(workers).prefetch(prefetch).pin_memory(pin_memory).seed(seed));
  const c10::Device device = runner.memory().device();
  const TrialResult trial = runner.run(
      TrialOptions()
          .batch_size(batch_size)
          .steps(steps)
          .warmup_steps(kLoaderWarmupSteps)
          .batch_source([&](int64_t) {
            Batch batch = *loader.next();
            if (!device.is_cpu()) {
              for (auto& input : batch.inputs) input = input.to(device, pin_memory);
              batch.target = batch.target.to(device, pin_memory);
            }
            return batch;
          }));
  if (!trial.fits) {
    throw Error(fmt::format("loader tuning: training at batch {} failed: {}", batch_size,
                            trial.error));
  }
  double total = 0;
  double waiting = 0;
  for (size_t i = 0; i < trial.step_seconds.size(); ++i) {
    total += trial.step_seconds[i];
    waiting += trial.wait_seconds[i];
  }
  LoaderRow row;
  row.workers = workers;
  row.pin_memory = pin_memory;
  row.samples_per_s =
      total > 0 ? static_cast<double>(batch_size * trial.step_seconds.size()) / total : 0;
  row.data_wait_fraction = total > 0 ? waiting / total : 0;
  return row;
}

LoaderTuning tune_loader(TrialRunner& runner, const Dataset& data, int64_t batch_size,
                         double step_seconds, int64_t prefetch, uint64_t seed, int64_t cores,
                         const std::function<bool()>& out_of_time) {
  LoaderTuning tuning;
  if (data.synthetic()) {
    tuning.note = "loader tuning skipped: the data are synthetic (made in memory, nothing to "
                  "read or decode); give --data imagefolder:DIR or fashion-mnist to tune it";
    return tuning;
  }
  const bool cuda = runner.memory().device().is_cuda();
  const int64_t steps = loader_steps(step_seconds);
  const std::vector<int64_t> grid = loader_worker_grid(cores);
  const size_t settings = grid.size() * (cuda ? 2 : 1);
  tuning.rows = time_loaders(
      [&](int64_t workers, bool pin) {
        return measure_loader(runner, data, batch_size, workers, pin, prefetch, steps, seed);
      },
      grid, cuda, out_of_time);
  tuning.choice = choose_loader(tuning.rows);
  tuning.note = fmt::format("loader: {} settings timed at batch {}, {} steps each{}{}",
                            tuning.rows.size(), batch_size, steps,
                            tuning.rows.size() < settings
                                ? fmt::format(" ({} left out: the time budget ran out)",
                                              settings - tuning.rows.size())
                                : "",
                            cuda ? "" : "; pinned memory does not apply on the CPU");
  return tuning;
}

std::optional<double> chosen_wait(const LoaderTuning& tuning) {
  if (!tuning.choice) return std::nullopt;
  for (const auto& row : tuning.rows) {
    if (row.workers == tuning.choice->workers && row.pin_memory == tuning.choice->pin_memory) {
      return row.data_wait_fraction;
    }
  }
  return std::nullopt;
}

std::string loader_table(const LoaderTuning& tuning) {
  std::string out = tuning.note + "\n";
  if (tuning.rows.empty()) return out;
  out += fmt::format("  {:>7}  {:>10}  {:>10}  {:>9}\n", "workers", "pin_memory", "samples/s",
                     "data wait");
  for (const auto& row : tuning.rows) {
    const bool chosen = tuning.choice && tuning.choice->workers == row.workers &&
                        tuning.choice->pin_memory == row.pin_memory;
    out += fmt::format("  {:>7}  {:>10}  {:>10.1f}  {:>8.1f}%{}\n", row.workers,
                       row.pin_memory ? "on" : "off", row.samples_per_s,
                       100 * row.data_wait_fraction, chosen ? "  <- chosen" : "");
  }
  if (tuning.choice) out += tuning.choice->reason + "\n";
  return out;
}

void apply_loader_choice(Plan& plan, const LoaderChoice& choice) {
  plan.workers = choice.workers;
  plan.pin_memory = choice.pin_memory;
  set_pipeline_reason(plan, choice.reason);
}

void set_pipeline_reason(Plan& plan, const std::string& why) {
  const std::string text = fmt::format("input pipeline: {} workers, pin_memory {}, prefetch {}{}",
                                       plan.workers, plan.pin_memory ? "on" : "off",
                                       plan.prefetch, why.empty() ? "" : "; " + why);
  plan.set_reason(PlanField::kInputPipeline, text);
}

std::string input_diagnosis(double data_wait_fraction, int64_t workers, double max_wait,
                            bool loader_tuned) {
  if (data_wait_fraction >= max_wait && loader_tuned) {
    return fmt::format("input-bound: the step waited for data {:.1f} % of the time with {} "
                       "loader worker(s), the best of the counts timed; the input pipeline or "
                       "the cores are the bottleneck (smaller or pre-resized images, or more "
                       "cores)",
                       100 * data_wait_fraction, workers);
  }
  if (data_wait_fraction >= max_wait) {
    return fmt::format("input-bound: the step waited for data {:.1f} % of the time with {} "
                       "loader worker(s); run tune with --data to pick --workers, or raise it",
                       100 * data_wait_fraction, workers);
  }
  return fmt::format("not input-bound: the step waited for data {:.1f} % of the time (under "
                     "{:.0f} %)",
                     100 * data_wait_fraction, 100 * max_wait);
}

nlohmann::json to_json(const LoaderRow& row) {
  return {{"workers", row.workers},
          {"pin_memory", row.pin_memory},
          {"samples_per_s", row.samples_per_s},
          {"data_wait_fraction", row.data_wait_fraction}};
}

nlohmann::json to_json(const std::vector<LoaderRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& row : rows) out.push_back(to_json(row));
  return out;
}

}  // namespace batchtune
