// Loader: order, completeness and determinism whatever the worker count;
// errors from workers; shutdown with batches in flight.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "batchtune/data/image_folder.h"
#include "batchtune/common/error.h"
#include "batchtune/data/loader.h"
#include "fake_clock.h"
#include "hang_guard.h"
#include "image_folder_fixture.h"

namespace {

using batchtune::Batch;
using batchtune::Loader;
using batchtune::LoaderOptions;
using batchtune::testing::ImageFolder;

/// Epochs of a seeded permutation cut into batches, as the trainer does.
batchtune::BatchIndices epochs_of(int64_t size, int64_t batch, int64_t epochs, uint64_t seed) {
  const int64_t per_epoch = size / batch;
  return [=](int64_t n) -> std::optional<std::vector<int64_t>> {
    if (n >= per_epoch * epochs) return std::nullopt;
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed * 31 + n / per_epoch);
    const at::Tensor perm = at::randperm(size, generator, at::kLong);
    std::vector<int64_t> out;
    for (int64_t i = 0; i < batch; ++i) out.push_back(perm[(n % per_epoch) * batch + i].item<int64_t>());
    return out;
  };
}

/// A dataset whose samples say their own index, slow enough that workers overlap.
class IndexDataset final : public batchtune::Dataset {
 public:
  explicit IndexDataset(int64_t size, int64_t fail_at = -1) : size_(size), fail_at_(fail_at) {}
  int64_t size() const override { return size_; }
  Batch get_batch(const std::vector<int64_t>& indices) const override { return draw_batch(indices, 0); }
  Batch draw_batch(const std::vector<int64_t>& indices, uint64_t draw) const override {
    ++calls;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    Batch b;
    std::vector<float> values;
    for (int64_t i : indices) {
      if (i == fail_at_) throw batchtune::Error("sample_" + std::to_string(i) + ".jpg: corrupt");
      values.push_back(static_cast<float>(i));
    }
    b.inputs = {at::tensor(values).view({-1, 1})};
    b.target = at::full({static_cast<int64_t>(indices.size())}, static_cast<int64_t>(draw % 1000));
    return b;
  }
  std::vector<int64_t> sample_shape() const override { return {1}; }
  int64_t classes() const override { return 2; }
  std::string describe() const override { return "index"; }
  mutable std::atomic<int64_t> calls{0};

 private:
  int64_t size_;
  int64_t fail_at_;
};

std::vector<std::vector<int64_t>> drain(Loader& loader) {
  std::vector<std::vector<int64_t>> batches;
  while (auto batch = loader.next()) {
    const at::Tensor x = batch->inputs[0].view(-1).to(at::kLong);
    batches.emplace_back(x.data_ptr<int64_t>(), x.data_ptr<int64_t>() + x.numel());
  }
  return batches;
}

TEST(Loader, EverySampleOncePerEpochInTheSameOrderForAnyWorkerCount) {
  const int64_t size = 60, batch = 6, epochs = 3;
  IndexDataset data(size);
  std::vector<std::vector<int64_t>> reference;
  for (int64_t workers : {0, 1, 2, 3, 5}) {
    for (int64_t prefetch : {0, 1, 4}) {
      Loader loader(data, epochs_of(size, batch, epochs, 7),
                    LoaderOptions().workers(workers).prefetch(prefetch).seed(1));
      const auto batches = drain(loader);
      ASSERT_EQ(static_cast<int64_t>(batches.size()), size / batch * epochs);
      EXPECT_EQ(loader.batches(), size / batch * epochs);
      for (int64_t e = 0; e < epochs; ++e) {
        std::multiset<int64_t> seen;
        for (int64_t k = 0; k < size / batch; ++k) {
          const auto& b = batches[static_cast<size_t>(e * size / batch + k)];
          seen.insert(b.begin(), b.end());
        }
        EXPECT_EQ(seen.size(), static_cast<size_t>(size));
        for (int64_t i = 0; i < size; ++i) EXPECT_EQ(seen.count(i), 1U) << "epoch " << e;
      }
      if (reference.empty()) reference = batches;
      EXPECT_EQ(batches, reference) << workers << " workers, prefetch " << prefetch;
      EXPECT_FALSE(loader.next().has_value());  // stays at the end
    }
  }
}

TEST(Loader, ImageBatchesAreIdenticalForAnyWorkerCount) {
  BATCHTUNE_REQUIRE_IMAGES();
  ImageFolder folder(3, 8);
  batchtune::ImageFolderDataset data(
      folder.dir(), batchtune::ImageFolderOptions().sample_shape({3, 20, 20}).seed(5));
  std::vector<Batch> reference;
  for (int64_t workers : {0, 1, 2, 4}) {
    Loader loader(data, epochs_of(data.size(), 4, 2, 3),
                  LoaderOptions().workers(workers).prefetch(2).seed(11));
    std::vector<Batch> batches;
    while (auto b = loader.next()) batches.push_back(*b);
    ASSERT_EQ(batches.size(), 12U);
    if (reference.empty()) {
      reference = batches;
      continue;
    }
    for (size_t i = 0; i < batches.size(); ++i) {
      EXPECT_TRUE(at::equal(batches[i].inputs[0], reference[i].inputs[0])) << workers << " " << i;
      EXPECT_TRUE(at::equal(batches[i].target, reference[i].target));
    }
  }
  // Another seed: other augmentation draws.
  Loader other(data, epochs_of(data.size(), 4, 2, 3), LoaderOptions().workers(2).seed(12));
  EXPECT_FALSE(at::equal(other.next()->inputs[0], reference[0].inputs[0]));
}

TEST(Loader, DrawsFollowTheBatchNumberFromFirstBatch) {
  IndexDataset data(20);
  auto indices = [](int64_t n) -> std::optional<std::vector<int64_t>> {
    if (n >= 6) return std::nullopt;
    return std::vector<int64_t>{n};
  };
  Loader whole(data, indices, LoaderOptions().workers(2).seed(4));
  std::vector<int64_t> draws;
  while (auto b = whole.next()) draws.push_back(b->target[0].item<int64_t>());
  // Resuming at batch 3 gives batches 3.. with the same draws.
  Loader resumed(data, indices, LoaderOptions().workers(1).seed(4).first_batch(3));
  for (size_t n = 3; n < 6; ++n) {
    auto b = resumed.next();
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(b->inputs[0][0][0].item<float>(), static_cast<float>(n));
    EXPECT_EQ(b->target[0].item<int64_t>(), draws[n]);
  }
  EXPECT_FALSE(resumed.next().has_value());
}

TEST(Loader, WorkerErrorReachesTheCallerAtThatBatchNamingTheFile) {
  IndexDataset data(30, /*fail_at=*/17);
  auto in_order = [](int64_t n) -> std::optional<std::vector<int64_t>> {
    if (n >= 10) return std::nullopt;
    return std::vector<int64_t>{3 * n, 3 * n + 1, 3 * n + 2};
  };
  for (int64_t workers : {0, 1, 3}) {
    Loader loader(data, in_order, LoaderOptions().workers(workers).prefetch(2));
    for (int n = 0; n < 5; ++n) ASSERT_TRUE(loader.next().has_value());
    try {
      loader.next();  // batch 5 holds sample 17
      FAIL() << workers << " workers: no error";
    } catch (const batchtune::Error& e) {
      EXPECT_NE(std::string(e.what()).find("sample_17.jpg"), std::string::npos) << e.what();
    }
    EXPECT_THROW(loader.next(), batchtune::Error);  // and again, not a later batch
  }
}

/// Batches of one sample each; building any batch but the first waits at a
/// gate the test opens, so that batches stay in flight as long as it likes.
/// Counts the builds begun and those still running.
class GatedDataset final : public batchtune::Dataset {
 public:
  int64_t size() const override { return 1000; }
  Batch get_batch(const std::vector<int64_t>& indices) const override { return draw_batch(indices, 0); }
  Batch draw_batch(const std::vector<int64_t>& indices, uint64_t) const override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ++begun_;
      ++running_;
      changed_.notify_all();
      if (indices.front() > 0) changed_.wait(lock, [&] { return open_; });
    }
    Batch b;
    b.inputs = {at::full({1, 1}, static_cast<float>(indices.front()))};
    b.target = at::zeros({1}, at::kLong);
    std::lock_guard<std::mutex> lock(mutex_);
    --running_;
    changed_.notify_all();
    return b;
  }
  std::vector<int64_t> sample_shape() const override { return {1}; }
  int64_t classes() const override { return 2; }
  std::string describe() const override { return "gated"; }

  /// Waits until `count` builds have begun.
  void wait_for_builds(int64_t count) const {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return begun_ >= count; });
  }
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  int64_t begun() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return begun_;
  }
  int64_t running() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return running_;
  }

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  mutable int64_t begun_ = 0;
  mutable int64_t running_ = 0;
  bool open_ = false;
};

TEST(Loader, StopsCleanlyWithBatchesInFlightAndBoundsTheQueue) {
  // Not a measurement: only ends a loader that never stops.
  batchtune::testing::HangGuard guard(120, "Loader.StopsCleanlyWithBatchesInFlightAndBoundsTheQueue");
  GatedDataset data;
  int64_t asked = 0;  // batches queued: the indices are asked for on this thread
  auto endless = [&](int64_t n) -> std::optional<std::vector<int64_t>> {
    ++asked;
    return std::vector<int64_t>{n % 1000};
  };
  {
    Loader loader(data, endless, LoaderOptions().workers(3).prefetch(2));
    ASSERT_TRUE(loader.next().has_value());
    // 3 workers x 2 ahead: 6 batches queued beyond the one taken, no more.
    EXPECT_EQ(asked, 1 + 6);
    // Each worker holds a batch mid-build at the gate; three wait in the queue.
    data.wait_for_builds(1 + 3);
    EXPECT_EQ(data.begun(), 1 + 3) << "more builds than workers";
    EXPECT_EQ(data.running(), 3);
    data.open();
  }  // joins with batches being built and queued: must not hang or crash
  EXPECT_EQ(data.running(), 0) << "a worker still building after the loader is gone";
  EXPECT_LE(data.begun(), 1 + 6) << "built a batch that was never queued";
  EXPECT_EQ(asked, 1 + 6) << "the loader asked for batches while stopping";
}

/// `inner`, where reading a batch takes 0.5 s of `clock`.
class HalfSecondDataset final : public batchtune::Dataset {
 public:
  HalfSecondDataset(const batchtune::Dataset& inner, batchtune::testing::FakeClock& clock)
      : inner_(inner), clock_(clock) {}
  int64_t size() const override { return inner_.size(); }
  Batch get_batch(const std::vector<int64_t>& indices) const override {
    clock_.advance(0.5);
    return inner_.get_batch(indices);
  }
  Batch draw_batch(const std::vector<int64_t>& indices, uint64_t draw) const override {
    clock_.advance(0.5);
    return inner_.draw_batch(indices, draw);
  }
  std::vector<int64_t> sample_shape() const override { return inner_.sample_shape(); }
  int64_t classes() const override { return inner_.classes(); }
  std::string describe() const override { return inner_.describe(); }

 private:
  const batchtune::Dataset& inner_;
  batchtune::testing::FakeClock& clock_;
};

TEST(Loader, WaitSecondsAreTheTimeNextWaitedOnItsClock) {
  IndexDataset index(10);
  batchtune::testing::FakeClock clock(3);
  HalfSecondDataset data(index, clock);
  auto three = [](int64_t n) -> std::optional<std::vector<int64_t>> {
    if (n >= 3) return std::nullopt;
    return std::vector<int64_t>{n, n + 3};
  };
  Loader loader(data, three, LoaderOptions().workers(0).clock(&clock));
  for (int64_t n = 0; n < 3; ++n) {
    clock.advance(7);  // the caller's own time: not waiting
    const auto batch = loader.next();
    ASSERT_TRUE(batch.has_value());
    EXPECT_EQ(batch->inputs[0][1][0].item<float>(), static_cast<float>(n + 3));
    EXPECT_DOUBLE_EQ(loader.wait_seconds(), 0.5 * static_cast<double>(n + 1));
  }
  EXPECT_FALSE(loader.next().has_value());
  EXPECT_DOUBLE_EQ(loader.wait_seconds(), 1.5) << "the end read no batch";
  EXPECT_DOUBLE_EQ(clock.now_s(), 3 + 3 * 7 + 3 * 0.5);
}

TEST(Loader, BadOptionsAreErrors) {
  IndexDataset data(10);
  auto none = [](int64_t) -> std::optional<std::vector<int64_t>> { return std::nullopt; };
  EXPECT_THROW(Loader(data, none, LoaderOptions().workers(-1)), batchtune::Error);
  EXPECT_THROW(Loader(data, none, LoaderOptions().prefetch(-2)), batchtune::Error);
  Loader empty(data, none, LoaderOptions().workers(2));
  EXPECT_FALSE(empty.next().has_value());
}

}  // namespace

#include "batchtune/memory/device_memory.h"
#include "batchtune/training/trainer.h"
#include "batchtune/step/workload.h"

namespace {

TEST(Loader, TrainerLearnsTheSameOnAnImageFolderWithAnyWorkerCount) {
  BATCHTUNE_REQUIRE_IMAGES();
  ImageFolder folder(2, 12);
  batchtune::ImageFolderDataset data(
      folder.dir(), batchtune::ImageFolderOptions().sample_shape({3, 16, 16}));
  std::vector<double> losses;
  for (int64_t workers : {0, 2}) {
    auto memory = batchtune::make_device_memory(c10::Device(c10::kCPU), int64_t{1} << 30);
    batchtune::Workload w(batchtune::WorkloadOptions()
                              .model("mlp")
                              .input_shape({3, 16, 16})
                              .classes(2)
                              .seed(7));
    batchtune::Plan plan = batchtune::make_plan(
        batchtune::PlanOptions().micro_batch_size(4).target_batch(8).base_lr(1e-2).workers(
            workers));
    batchtune::Trainer trainer(w, *memory, plan, data, nullptr,
                               batchtune::TrainOptions().epochs(3).seed(2));
    const auto summary = trainer.run();
    EXPECT_EQ(summary.steps, 3 * 24 / 8);
    losses.push_back(summary.final_loss);
  }
  EXPECT_DOUBLE_EQ(losses[0], losses[1]);
}

}  // namespace
