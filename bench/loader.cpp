// bench/loader: the input pipeline on a generated image folder (2000 JPEGs
// of about 96x96 in 4 classes, under /tmp): decoded samples/s with 0, 1 and 2
// workers; then training `convnet` (3x32x32) through the trainer with 0
// workers and with the worker count loader tuning picks, the share of the
// step spent waiting for data and the speedup.
//
//   build/bench/loader [--quick]
//
// Prints markdown tables (README "Input pipeline").
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "batchtune/data/image_folder.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/monitoring/environment.h"
#include "batchtune/data/loader.h"
#include "batchtune/tuning/loader_tuning.h"
#include "batchtune/training/trainer.h"
#include "batchtune/step/trial.h"
#include "batchtune/step/workload.h"
#include "data/image_codec.h"

namespace {

using namespace batchtune;
using WallClock = std::chrono::steady_clock;

constexpr const char* kDir = "/tmp/batchtune-bench-loader";
constexpr int kClasses = 4;
constexpr int64_t kBatch = 64;
const std::vector<int64_t> kShape{3, 32, 32};

/// Writes the folder once; a later run reuses it.
void make_folder(int images) {
  const std::string done = std::string(kDir) + "/.complete-" + std::to_string(images);
  struct stat st{};
  if (::stat(done.c_str(), &st) == 0) return;
  ::mkdir(kDir, 0755);
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> side(80, 112);
  std::uniform_int_distribution<int> noise(0, 255);
  for (int c = 0; c < kClasses; ++c) {
    const std::string class_dir = fmt::format("{}/class{}", kDir, c);
    ::mkdir(class_dir.c_str(), 0755);
    for (int i = 0; i < images / kClasses; ++i) {
      Image image;
      image.width = side(rng);
      image.height = side(rng);
      image.channels = 3;
      image.pixels.resize(static_cast<size_t>(image.width) * image.height * 3);
      // Smooth gradients with noise: JPEG sizes like photos', not flat fills.
      for (int y = 0; y < image.height; ++y) {
        for (int x = 0; x < image.width; ++x) {
          for (int ch = 0; ch < 3; ++ch) {
            const int v = (ch == c % 3 ? 120 : 40) + x + y / 2 + noise(rng) / 4;
            image.pixels[(static_cast<size_t>(y) * image.width + x) * 3 + ch] =
                static_cast<uint8_t>(std::min(v, 255));
          }
        }
      }
      const auto bytes = encode_jpeg(image, 90);
      std::ofstream(fmt::format("{}/{:05d}.jpg", class_dir, i), std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
  }
  std::ofstream(done) << "ok\n";
}

BatchIndices epoch_batches(int64_t size, int64_t batch, int64_t count, uint64_t seed) {
  auto order = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) (*order)[static_cast<size_t>(i)] = i;
  std::shuffle(order->begin(), order->end(), std::mt19937_64(seed));
  return [=](int64_t n) -> std::optional<std::vector<int64_t>> {
    if (n >= count) return std::nullopt;
    const int64_t per_epoch = size / batch;
    const auto first = order->begin() + (n % per_epoch) * batch;
    return std::vector<int64_t>(first, first + batch);
  };
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int images = quick ? 400 : 2000;
  const int repeats = quick ? 1 : 5;
  const int threads = configure_threads(0);
  make_folder(images);
  ImageFolderDataset data(kDir, ImageFolderOptions().sample_shape(kShape));
  fmt::print("{}; {} LibTorch thread(s), {} cores\n\n", data.describe(), threads,
             std::thread::hardware_concurrency());

  // 1. Decoding alone: an epoch of batches through the loader. The worker
  // counts take turns within each round, so load from other processes falls
  // on all of them; ratios are per round, then the median.
  const std::vector<int64_t> decode_workers{0, 1, 2};
  std::vector<std::vector<double>> decode_rates(decode_workers.size());
  std::vector<std::vector<double>> decode_ratios(decode_workers.size());
  for (int r = 0; r < repeats; ++r) {
    for (size_t c = 0; c < decode_workers.size(); ++c) {
      Loader loader(data, epoch_batches(data.size(), kBatch, data.size() / kBatch, r),
                    LoaderOptions().workers(decode_workers[c]));
      const auto start = WallClock::now();
      int64_t samples = 0;
      while (auto batch = loader.next()) samples += batch->inputs[0].size(0);
      decode_rates[c].push_back(samples /
                                std::chrono::duration<double>(WallClock::now() - start).count());
      decode_ratios[c].push_back(decode_rates[c].back() / decode_rates[0].back());
    }
  }
  fmt::print("| workers | decoded samples/s (median of {}) | vs 0 workers (median of rounds) |\n"
             "|---|---|---|\n",
             repeats);
  for (size_t c = 0; c < decode_workers.size(); ++c) {
    fmt::print("| {} | {:.0f} | {:.2f}x |\n", decode_workers[c], median(decode_rates[c]),
               median(decode_ratios[c]));
  }

  // 2. Training convnet on it: 0 workers, then the tuned count.
  auto memory = make_device_memory(c10::Device(c10::kCPU), int64_t{4} << 30);
  Workload workload(WorkloadOptions().model("convnet").input_shape(kShape).classes(kClasses));
  TrialRunner runner(workload, *memory);
  const TrialResult probe =
      runner.run(TrialOptions().batch_size(kBatch).steps(3).warmup_steps(1));
  const LoaderTuning tuning = tune_loader(runner, data, kBatch, median(probe.step_seconds),
                                          kDefaultPrefetch, 0, std::thread::hardware_concurrency());
  fmt::print("\nloader tuning at batch {}:\n{}\n", kBatch, loader_table(tuning));

  const int64_t steps = quick ? 8 : 30;
  std::vector<int64_t> configs{0};
  if (tuning.choice->workers != 0) configs.push_back(tuning.choice->workers);
  std::vector<std::vector<double>> rates(configs.size()), waits(configs.size()),
      speedups(configs.size());
  for (int r = 0; r < repeats; ++r) {
    for (size_t c = 0; c < configs.size(); ++c) {
      Workload w(WorkloadOptions().model("convnet").input_shape(kShape).classes(kClasses));
      Plan plan =
          make_plan(PlanOptions().micro_batch_size(kBatch).base_lr(1e-3).workers(configs[c]));
      Trainer trainer(w, *memory, plan, data, nullptr,
                      TrainOptions().steps(steps).log_every(steps / 2).seed(r));
      TrainEvent last;
      trainer.set_callback([&](const TrainEvent& e) {
        if (e.kind == TrainEvent::Kind::kLog) last = e;  // the second half: steady state
      });
      trainer.run();
      rates[c].push_back(last.samples_per_s);
      waits[c].push_back(1 - last.busy_fraction);
      speedups[c].push_back(rates[c].back() / rates[0].back());
    }
  }
  fmt::print("| loader | train samples/s (median of {}) | data wait share of step | speedup "
             "(median of rounds) |\n|---|---|---|---|\n",
             repeats);
  for (size_t c = 0; c < configs.size(); ++c) {
    fmt::print("| {} worker{}{} | {:.0f} | {:.1f} % | {:.2f}x |\n", configs[c],
               configs[c] == 1 ? "" : "s", c == 0 ? " (default)" : " (tuned)", median(rates[c]),
               100 * median(waits[c]), median(speedups[c]));
  }
  return 0;
}
