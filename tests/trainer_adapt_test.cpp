// `train --adapt` in the training loop: the schedule it keeps, the samples
// it takes, resuming and refusals. The policy's decisions themselves are
// tested in batch_adapter_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <sys/stat.h>

#include "batchtune/common/error.h"
#include "batchtune/data/sample_cursor.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/reports/train_reporter.h"
#include "batchtune/step/workload.h"
#include "batchtune/training/trainer.h"
#include "fake_clock.h"
#include "test_helpers.h"

namespace batchtune {
namespace {

constexpr int64_t kMemoryLimit = int64_t{1} << 30;

Workload mlp() {
  return Workload(WorkloadOptions().model("mlp").input_shape({16}).classes(4).seed(7));
}

/// Counts how often each sample is read, per epoch of the trainer's order.
class CountingDataset final : public Dataset {
 public:
  explicit CountingDataset(const Dataset& inner) : inner_(inner) {}
  int64_t size() const override { return inner_.size(); }
  Batch get_batch(const std::vector<int64_t>& indices) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int64_t i : indices) ++reads_[i];
    return inner_.get_batch(indices);
  }
  std::vector<int64_t> sample_shape() const override { return inner_.sample_shape(); }
  int64_t classes() const override { return inner_.classes(); }
  std::string describe() const override { return inner_.describe(); }
  std::map<int64_t, int64_t> reads() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return reads_;
  }

 private:
  const Dataset& inner_;
  mutable std::mutex mutex_;
  mutable std::map<int64_t, int64_t> reads_;
};

/// A run whose step takes 1 s whatever its batch (on a fake clock): a
/// larger batch is that much faster per sample, so the policy has a reason
/// to grow it.
struct AdaptRun {
  testing::FakeClock clock{0};
  /// Called before each step too, with the steps done.
  std::function<void(int64_t)> before_step;
  std::unique_ptr<DeviceMemory> memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);

  TrainSummary run(Workload& w, const Dataset& data, TrainOptions options,
                   std::vector<TrainEvent>* events = nullptr) {
    Plan plan = make_plan(PlanOptions().micro_batch_size(16).base_lr(1e-2).base_batch(16));
    plan.workers = 0;  // batches read when trained, none built ahead and dropped
    Trainer trainer(w, *memory, plan, data, nullptr,
                    options.seed(3).clock(&clock).adapt(true).adapt_options(
                        AdaptOptions().every(5)));
    trainer.set_before_step([&](int64_t step) {
      clock.advance(1);
      if (before_step) before_step(step);
    });
    if (events != nullptr) trainer.set_callback([&](const TrainEvent& e) { events->push_back(e); });
    return trainer.run();
  }
};

int64_t samples_of(const std::vector<BatchChange>& schedule, int64_t steps) {
  int64_t samples = 0;
  for (size_t i = 0; i < schedule.size(); ++i) {
    const int64_t end = i + 1 < schedule.size() ? schedule[i + 1].step : steps;
    samples += (end - schedule[i].step) * schedule[i].global_batch_size;
  }
  return samples;
}

TEST(TrainerAdapt, GrowsTheBatchWhereItPaysAndKeepsAScheduleOfEveryChange) {
  const auto train = testing::toy_data({16}, 4096, 4, 2);
  CountingDataset data(*train);
  Workload w = mlp();
  AdaptRun run;
  std::vector<TrainEvent> events;
  const TrainSummary s = run.run(w, data, TrainOptions().epochs(1), &events);

  ASSERT_GE(s.batch_schedule.size(), 2u) << "a batch 2x as fast per sample is taken";
  const BatchChange& start = s.batch_schedule.front();
  EXPECT_EQ(start.step, 0);
  EXPECT_EQ(start.global_batch_size, 16);
  EXPECT_EQ(start.lr, 1e-2);
  EXPECT_FALSE(start.noise_scale.has_value());
  int64_t changes = 0;
  for (size_t i = 1; i < s.batch_schedule.size(); ++i) {
    const BatchChange& c = s.batch_schedule[i];
    EXPECT_GT(c.step, s.batch_schedule[i - 1].step);
    EXPECT_EQ(c.step % 5, 0) << "decisions every 5 steps";
    EXPECT_EQ(c.micro_batch_size * c.accumulation_steps, c.global_batch_size);
    EXPECT_GE(c.global_batch_size, 16);
    EXPECT_LE(c.global_batch_size, 16 * kDefaultAdaptGrowth);
    EXPECT_TRUE(c.noise_scale.has_value());
    EXPECT_GT(c.lr, 0);
    EXPECT_FALSE(c.reason.empty());
    ++changes;
  }
  int64_t change_events = 0;
  for (const auto& e : events) change_events += e.kind == TrainEvent::Kind::kBatchChange ? 1 : 0;
  EXPECT_EQ(change_events, changes) << "every change is logged";
  EXPECT_GT(s.global_batch_size, 16);
  EXPECT_EQ(s.global_batch_size, s.batch_schedule.back().global_batch_size);
  EXPECT_EQ(s.samples, samples_of(s.batch_schedule, s.steps));
  // One epoch: every sample read at most once (the tail that makes no batch
  // of the size then trained is left out), and nearly all of them read.
  const auto reads = data.reads();
  for (const auto& [index, count] : reads) EXPECT_EQ(count, 1) << "sample " << index;
  EXPECT_EQ(static_cast<int64_t>(reads.size()), s.samples);
  EXPECT_GT(s.samples, 4096 - 16 * kDefaultAdaptGrowth);
  EXPECT_NEAR(s.epochs, 1.0, 1e-9) << "the epoch finished";

  const nlohmann::json j = to_json(s);
  ASSERT_TRUE(j.contains("batch_schedule"));
  EXPECT_EQ(j.at("batch_schedule").size(), s.batch_schedule.size());
  EXPECT_EQ(j.at("batch_schedule").back().at("global_batch_size"), s.global_batch_size);
}

TEST(TrainerAdapt, WithoutAccumulationEveryStepMeasuresTheNoiseAgainstThePreviousOnes) {
  const auto data = testing::toy_data({16}, 1024, 4, 2);
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  for (bool adapt : {true, false}) {
    Workload w = mlp();
    const Plan plan = make_plan(PlanOptions().micro_batch_size(16));
    Trainer trainer(w, *memory, plan, *data, nullptr,
                    TrainOptions().steps(12).adapt(adapt).adapt_options(AdaptOptions().every(1000)));
    trainer.run();
    // `--adapt` measures every step but the first two (no split); a plain
    // run splits one step in 50 (step 0) and keeps no copy.
    EXPECT_EQ(trainer.noise_scale().estimator().measurements(), adapt ? 10 : 1) << adapt;
  }
}

TEST(TrainerAdapt, WithoutAdaptTheSummaryHasNoSchedule) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto train = testing::toy_data({16}, 256, 4, 2);
  Workload w = mlp();
  const Plan plan = make_plan(PlanOptions().micro_batch_size(16).base_lr(1e-2));
  const TrainSummary s = Trainer(w, *memory, plan, *train, nullptr, TrainOptions().steps(4)).run();
  EXPECT_TRUE(s.batch_schedule.empty());
  EXPECT_FALSE(to_json(s).contains("batch_schedule"));
}

TEST(TrainerAdapt, AResumeContinuesTheSameScheduleAndWeights) {
  const testing::OneThread one_thread;  // two runs compared bit for bit
  const auto train = testing::toy_data({16}, 4096, 4, 2);
  const std::string dir = ::testing::TempDir() + "batchtune_adapt_resume_test";
  std::remove((dir + "/" + kCheckpointFile).c_str());
  ::mkdir(dir.c_str(), 0755);

  Workload whole = mlp();
  const TrainSummary s_whole = AdaptRun().run(whole, *train, TrainOptions().steps(90));
  ASSERT_GE(s_whole.batch_schedule.size(), 2u);
  // Stopped after a change, mid-window, then resumed.
  const int64_t stop = s_whole.batch_schedule[1].step + 3;
  {
    Workload first = mlp();
    AdaptRun().run(first, *train, TrainOptions().steps(stop).checkpoint_dir(dir));
  }
  Workload second = mlp();
  const TrainSummary s_resumed =
      AdaptRun().run(second, *train, TrainOptions().steps(90).checkpoint_dir(dir).resume(true));

  EXPECT_EQ(s_resumed.resumed_from_step, stop);
  ASSERT_EQ(s_resumed.batch_schedule.size(), s_whole.batch_schedule.size());
  for (size_t i = 0; i < s_whole.batch_schedule.size(); ++i) {
    EXPECT_EQ(s_resumed.batch_schedule[i].step, s_whole.batch_schedule[i].step) << i;
    EXPECT_EQ(s_resumed.batch_schedule[i].global_batch_size,
              s_whole.batch_schedule[i].global_batch_size)
        << i;
    EXPECT_DOUBLE_EQ(s_resumed.batch_schedule[i].lr, s_whole.batch_schedule[i].lr) << i;
  }
  EXPECT_EQ(s_resumed.samples, s_whole.samples);
  EXPECT_EQ(s_resumed.final_loss, s_whole.final_loss);
  auto a = whole.model().parameters();
  auto b = second.model().parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << "parameter " << i;

  // The checkpoint of an --adapt run is refused without --adapt.
  Workload third = mlp();
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const Plan plan = make_plan(PlanOptions().micro_batch_size(16).base_lr(1e-2).base_batch(16));
  Trainer plain(third, *memory, plan, *train, nullptr,
                TrainOptions().steps(95).seed(3).checkpoint_dir(dir).resume(true));
  try {
    plain.run();
    ADD_FAILURE() << "resumed an --adapt checkpoint without --adapt";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("resume it with --adapt"), std::string::npos) << e.what();
  }
}

/// The error of resuming the checkpoint in `dir` with `options` (adapt on, as
/// AdaptRun's plan), or "resumed" and the lines it said on resuming.
std::string resume_error(const Dataset& train, const std::string& dir, TrainOptions options) {
  Workload w = mlp();
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const Plan plan = make_plan(PlanOptions().micro_batch_size(16).base_lr(1e-2).base_batch(16));
  std::string said;
  try {
    Trainer trainer(w, *memory, plan, train, nullptr,
                    options.steps(12).seed(3).checkpoint_dir(dir).resume(true));
    trainer.set_callback([&](const TrainEvent& e) {
      if (e.kind == TrainEvent::Kind::kResumed) said += "\n" + e.message;
    });
    trainer.run();
  } catch (const Error& e) {
    return e.what();
  }
  return "resumed" + said;
}

TEST(TrainerAdapt, AResumeUnderOtherBoundsIsRefusedAndAnotherWindowIsSaidToApply) {
  // New --adapt-min-batch/--adapt-max-batch/--adapt-every were taken
  // silently, and the run trained outside them.
  const auto train = testing::toy_data({16}, 1024, 4, 2);
  const std::string dir = ::testing::TempDir() + "batchtune_adapt_bounds_test";
  std::remove((dir + "/" + kCheckpointFile).c_str());
  ::mkdir(dir.c_str(), 0755);
  {
    Workload first = mlp();
    AdaptRun().run(first, *train, TrainOptions().steps(6).checkpoint_dir(dir));  // every 5
  }
  const auto adapt = [](AdaptOptions o) { return TrainOptions().adapt(true).adapt_options(o); };
  const std::string least =
      resume_error(*train, dir, adapt(AdaptOptions().every(5).min_global_batch(16)));
  EXPECT_NE(least.find("resume with --adapt-min-batch"), std::string::npos) << least;
  const std::string most =
      resume_error(*train, dir, adapt(AdaptOptions().every(5).max_global_batch(32)));
  EXPECT_NE(most.find("resume with --adapt-max-batch"), std::string::npos) << most;
  const std::string same = resume_error(*train, dir, adapt(AdaptOptions().every(5)));
  EXPECT_EQ(same.find("applies from here on"), std::string::npos) << same;
  // Another window applies, and is said (the run above ended at step 12).
  const std::string every = resume_error(*train, dir, adapt(AdaptOptions().every(10)));
  EXPECT_EQ(every.rfind("resumed", 0), 0u) << every;
  EXPECT_NE(every.find("--adapt-every 10 applies from here on; the checkpoint's run decided "
                       "every 5 steps"),
            std::string::npos)
      << every;
}

TEST(TrainerAdapt, ACheckpointWrittenWithoutAdaptIsRefusedWithItAsATextOneIs) {
  // Images accepted it, text refused it: one rule.
  const auto train = testing::toy_data({16}, 1024, 4, 2);
  const std::string dir = ::testing::TempDir() + "batchtune_adapt_plain_test";
  std::remove((dir + "/" + kCheckpointFile).c_str());
  ::mkdir(dir.c_str(), 0755);
  {
    Workload w = mlp();
    auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
    const Plan plan = make_plan(PlanOptions().micro_batch_size(16).base_lr(1e-2).base_batch(16));
    Trainer(w, *memory, plan, *train, nullptr,
            TrainOptions().steps(4).seed(3).checkpoint_dir(dir))
        .run();
  }
  const std::string message = resume_error(
      *train, dir, TrainOptions().adapt(true).adapt_options(AdaptOptions().every(5)));
  EXPECT_EQ(message.rfind("--resume: ", 0), 0u) << message;
  EXPECT_NE(message.find("was written by a run without --adapt; resume it without --adapt"),
            std::string::npos)
      << message;
}

TEST(TrainerAdapt, IsRefusedWithoutTheNoiseScaleItFollows) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  const auto train = testing::toy_data({16}, 256, 4, 2);
  Workload w = mlp();
  const Plan plan = make_plan(PlanOptions().micro_batch_size(16).base_lr(1e-2));
  try {
    Trainer(w, *memory, plan, *train, nullptr,
            TrainOptions().steps(4).adapt(true).measure_noise_scale(false));
    ADD_FAILURE() << "--adapt without the noise scale was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--adapt:", 0), 0u) << e.what();
  }
  try {
    Trainer(w, *memory, plan, *train, nullptr,
            TrainOptions().steps(4).adapt(true).adapt_options(AdaptOptions().max_global_batch(
                1000)));
    ADD_FAILURE() << "a largest batch over the data was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--adapt-max-batch:", 0), 0u) << e.what();
  }
}

TEST(TrainerAdapt, EvalEverySamplesEvaluatesByTheSamplesWhateverTheBatch) {
  const auto train = testing::toy_data({16}, 4096, 4, 2);
  const auto test = testing::toy_data({16}, 64, 4, 12);
  Workload w = mlp();
  AdaptRun run;
  Plan plan = make_plan(PlanOptions().micro_batch_size(16).base_lr(1e-2).base_batch(16));
  plan.workers = 0;
  Trainer trainer(w, *run.memory, plan, *train, test.get(),
                  TrainOptions().steps(120).seed(3).clock(&run.clock).adapt(true)
                      .adapt_options(AdaptOptions().every(5)).eval_every_samples(400));
  trainer.set_before_step([&](int64_t) { run.clock.advance(1); });
  std::vector<int64_t> evaluated_after;  // steps; an epoch's end evaluates too
  trainer.set_callback([&](const TrainEvent& e) {
    if (e.kind == TrainEvent::Kind::kEvaluation || e.kind == TrainEvent::Kind::kEpochEnd) {
      evaluated_after.push_back(e.step);
    }
  });
  const TrainSummary s = trainer.run();
  ASSERT_GE(s.batch_schedule.size(), 2u);
  // Replay the samples per step from the schedule: an evaluation follows
  // exactly the steps that crossed a multiple of 400 samples or ended an
  // epoch.
  SampleCursor cursor(train->size(), 16);
  for (size_t i = 1; i < s.batch_schedule.size(); ++i) {
    cursor.change(s.batch_schedule[i].step, s.batch_schedule[i].global_batch_size);
  }
  std::vector<int64_t> expected;
  int64_t samples = 0;
  for (int64_t step = 0; step < s.steps; ++step) {
    const int64_t before = samples;
    samples += cursor.global_batch(step);
    if (samples / 400 > before / 400 || cursor.at(step + 1).epoch != cursor.at(step).epoch) {
      expected.push_back(step + 1);
    }
  }
  EXPECT_EQ(evaluated_after, expected);
  try {
    Trainer(w, *run.memory, plan, *train, test.get(),
            TrainOptions().steps(4).eval_every(5).eval_every_samples(400));
    ADD_FAILURE() << "both evaluation cadences were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--eval-every-samples:", 0), 0u) << e.what();
  }
}

TEST(TrainerAdapt, DecidesNoChangeOnALossThatIsNotFinite) {
  // Its noise scale froze at the last finite measurement, and it went on
  // deciding on it (JSON final_loss null beside noise_scale 16).
  const auto train = testing::toy_data({16}, 4096, 4, 2);
  Workload healthy = mlp();
  AdaptRun control;
  const TrainSummary c = control.run(healthy, *train, TrainOptions().epochs(1));
  ASSERT_GE(c.batch_schedule.size(), 3u) << "a healthy run changes more than once";
  // Poisoned right after its first change: the noise scale was measured
  // enough to decide on, and then froze.
  const int64_t kPoisonedAt = c.batch_schedule[1].step;

  Workload w = mlp();
  AdaptRun run;
  run.before_step = [&](int64_t step) {
    if (step != kPoisonedAt) return;
    at::NoGradGuard no_grad;
    for (auto& p : w.model().parameters()) p.fill_(NAN);
  };
  std::vector<TrainEvent> events;
  const TrainSummary s = run.run(w, *train, TrainOptions().epochs(1), &events);
  for (const BatchChange& change : s.batch_schedule) {
    EXPECT_LE(change.step, kPoisonedAt) << "a change decided on a loss that is not finite";
  }
  int64_t said = 0;
  for (const auto& e : events) {
    if (e.kind != TrainEvent::Kind::kDivergence) continue;
    ++said;
    EXPECT_NE(e.message.find("--adapt decides no more changes of the batch"), std::string::npos)
        << e.message;
    EXPECT_LE(e.step, kPoisonedAt + 5) << "said at the next decision at the latest";
  }
  EXPECT_EQ(said, 1);
  ASSERT_TRUE(s.divergence.has_value());
  EXPECT_EQ(s.divergence->kind, Divergence::Kind::kNotFinite);
}

TEST(TrainerAdapt, AResumedRunCountsItsOptimizerStateAndKeptGradientAsTheWholeRunDoes) {
  // 608.3 KiB live before a resume, 202.8 KiB after: the state loaded from
  // the checkpoint was made outside the emulated device's count.
  const auto train = testing::toy_data({16}, 1024, 4, 2);
  const std::string dir = ::testing::TempDir() + "batchtune_adapt_resume_memory_test";
  std::remove((dir + "/" + kCheckpointFile).c_str());
  ::mkdir(dir.c_str(), 0755);
  auto memory = make_device_memory(c10::Device(c10::kCPU), kMemoryLimit);
  constexpr int64_t kStop = 6;
  const int64_t base = memory->live_bytes();
  // The live bytes after step kStop + 1, over what was live before the run.
  const auto live_after_next_step = [&](TrainOptions options) {
    Workload w = mlp();  // Adam: two moments per parameter
    Plan plan = make_plan(PlanOptions().micro_batch_size(16).base_lr(1e-2).base_batch(16));
    plan.workers = 0;
    Trainer trainer(w, *memory, plan, *train, nullptr,
                    options.seed(3).adapt(true).adapt_options(AdaptOptions().every(5)));
    int64_t live = -1;
    trainer.set_before_step([&](int64_t step) {
      if (step == kStop + 1) live = memory->live_bytes() - base;
    });
    trainer.run();
    EXPECT_TRUE(trainer.training_step().successive().holding()) << "a gradient kept";
    return live;
  };
  const int64_t whole = live_after_next_step(TrainOptions().steps(kStop + 3));
  live_after_next_step(TrainOptions().steps(kStop).checkpoint_dir(dir));
  const int64_t resumed =
      live_after_next_step(TrainOptions().steps(kStop + 3).checkpoint_dir(dir).resume(true));
  ASSERT_GT(whole, 0);
  // The same tensors live in both; a few scalars of bookkeeping may differ.
  EXPECT_NEAR(static_cast<double>(resumed), static_cast<double>(whole), 1024.0)
      << "whole run " << whole << " bytes, resumed " << resumed;
}

}  // namespace
}  // namespace batchtune
