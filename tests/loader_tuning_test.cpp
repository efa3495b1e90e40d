// Loader tuning: the worker grid and the choice, with made-up timings; the
// plan it writes; the tune command's `loader` rows on a real image folder.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <fstream>

#include "batchtune/common/interrupt.h"
#include "batchtune/tuning/loader_tuning.h"
#include "cli_runner.h"
#include "image_folder_fixture.h"

namespace {

using batchtune::LoaderRow;

TEST(LoaderTuning, WorkerGridDoublesUpToTheCores) {
  EXPECT_EQ(batchtune::loader_worker_grid(1), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(batchtune::loader_worker_grid(2), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(batchtune::loader_worker_grid(6), (std::vector<int64_t>{0, 1, 2, 4, 6}));
  EXPECT_EQ(batchtune::loader_worker_grid(8), (std::vector<int64_t>{0, 1, 2, 4, 8}));
}

TEST(LoaderTuning, AnInterruptStopsTheTimingOfWorkerCounts) {
  batchtune::InterruptHandler interrupts;
  int measured = 0;
  const auto fake = [&](int64_t workers, bool pin) {
    if (++measured == 2) batchtune::request_interrupt(SIGTERM);  // during the second
    return LoaderRow{workers, pin, 100, 0};
  };
  EXPECT_THROW(batchtune::time_loaders(fake, batchtune::loader_worker_grid(8), false),
               batchtune::Interrupted);
  EXPECT_EQ(measured, 2) << "no setting is timed after the signal";
  batchtune::request_interrupt(0);
}

TEST(LoaderTuning, OutOfTimeLeavesTheLargerWorkerCountsOut) {
  int measured = 0;
  const auto fake = [&](int64_t workers, bool pin) {
    ++measured;
    return LoaderRow{workers, pin, 100, 0};
  };
  // Out of time from the start: the first setting is still timed (a choice
  // needs a row), nothing after it.
  const auto one = batchtune::time_loaders(fake, batchtune::loader_worker_grid(8), true,
                                           [] { return true; });
  ASSERT_EQ(one.size(), 1U);
  EXPECT_EQ(one[0].workers, 0);
  EXPECT_EQ(measured, 1);
  // Time for three settings: 0 workers (both pin settings) and 1 unpinned.
  measured = 0;
  const auto three = batchtune::time_loaders(fake, batchtune::loader_worker_grid(8), true,
                                             [&] { return measured >= 3; });
  ASSERT_EQ(three.size(), 3U);
  EXPECT_EQ(three[2].workers, 1);
  EXPECT_FALSE(three[2].pin_memory);
}

TEST(LoaderTuning, PicksTheFewestWorkersThatKeepTheWaitUnderFivePercent) {
  // Fake timings: decoding costs 30 ms a batch, computing 10 ms; each worker
  // takes 30 ms / workers off the wait until it hides behind compute.
  const auto fake = [](int64_t workers, bool pin) {
    const double compute = 0.010;
    const double wait = workers == 0 ? 0.030 : std::max(0.0, 0.030 / workers - compute) + 0.0002;
    const double step = compute + wait - (pin ? 0.0001 : 0);
    return LoaderRow{workers, pin, 64 / step, wait / step};
  };
  const auto rows = batchtune::time_loaders(fake, batchtune::loader_worker_grid(8), false);
  ASSERT_EQ(rows.size(), 5U);
  EXPECT_GT(rows[1].data_wait_fraction, 0.05);  // 1 worker: 20 ms of 30 wait
  EXPECT_GT(rows[2].data_wait_fraction, 0.05);  // 2 workers: 5 ms of 15
  EXPECT_LT(rows[3].data_wait_fraction, 0.05);  // 4 workers: hidden
  const auto choice = batchtune::choose_loader(rows);
  EXPECT_EQ(choice.workers, 4);  // not 8, though 8 is as fast
  EXPECT_FALSE(choice.pin_memory);
  EXPECT_NE(choice.reason.find("fewest"), std::string::npos) << choice.reason;

  // On CUDA both pin settings are timed; the faster one at that count wins.
  const auto cuda_rows = batchtune::time_loaders(fake, {0, 2, 4}, true);
  ASSERT_EQ(cuda_rows.size(), 6U);
  EXPECT_TRUE(cuda_rows[1].pin_memory);
  const auto cuda_choice = batchtune::choose_loader(cuda_rows);
  EXPECT_EQ(cuda_choice.workers, 4);
  EXPECT_TRUE(cuda_choice.pin_memory);
}

TEST(LoaderTuning, WhenNothingKeepsUpTheFastestWins) {
  const std::vector<LoaderRow> rows{{0, false, 100, 0.70}, {1, false, 180, 0.40},
                                    {2, false, 210, 0.25}, {4, false, 200, 0.30}};
  const auto choice = batchtune::choose_loader(rows);
  EXPECT_EQ(choice.workers, 2);
  EXPECT_NE(choice.reason.find("no setting keeps"), std::string::npos) << choice.reason;
}

TEST(LoaderTuning, AShortWaitThatComesWithASlowerStepDoesNotCount) {
  // Workers that starve the compute threads: little wait, but slower.
  const std::vector<LoaderRow> rows{{0, false, 280, 0.10}, {1, false, 55, 0.02},
                                    {2, false, 260, 0.03}};
  const auto choice = batchtune::choose_loader(rows);
  EXPECT_EQ(choice.workers, 2);  // within 10 % of the fastest, and keeps up
  const std::vector<LoaderRow> starved{{0, false, 280, 0.10}, {1, false, 55, 0.02}};
  EXPECT_EQ(batchtune::choose_loader(starved).workers, 0);  // the fastest
}

TEST(LoaderTuning, ZeroWorkersWhenTheDataIsCheap) {
  const std::vector<LoaderRow> rows{{0, false, 500, 0.01}, {1, false, 520, 0.0}};
  EXPECT_EQ(batchtune::choose_loader(rows).workers, 0);
}

TEST(LoaderTuning, StepsFillASecondWithinBounds) {
  EXPECT_EQ(batchtune::loader_steps(0.1), 10);
  EXPECT_EQ(batchtune::loader_steps(2.0), batchtune::kLoaderMinSteps);
  EXPECT_EQ(batchtune::loader_steps(1e-6), batchtune::kLoaderMaxSteps);
  EXPECT_EQ(batchtune::loader_steps(0.05), 20);
  EXPECT_EQ(batchtune::loader_steps(0), batchtune::kLoaderMinSteps);
}

TEST(LoaderTuning, ChoiceGoesIntoThePlan) {
  batchtune::Plan plan;
  plan.reasons = {{batchtune::PlanField::kMicroBatch, "micro-batch 8"},
                  {batchtune::PlanField::kInputPipeline, "input pipeline: 0 workers, pin_memory off, prefetch 2"}};
  batchtune::apply_loader_choice(plan, {2, false, "loader: 2 workers: the fewest ..."});
  EXPECT_EQ(plan.workers, 2);
  EXPECT_EQ(plan.reasons.size(), 2U);
  EXPECT_EQ(plan.reasons[1].text.rfind("input pipeline: 2 workers", 0), 0U) << plan.reasons[1].text;
  const auto json = batchtune::to_json(std::vector<LoaderRow>{{2, false, 10.5, 0.01}});
  EXPECT_EQ(json[0]["workers"], 2);
  EXPECT_EQ(json[0]["pin_memory"], false);
  EXPECT_DOUBLE_EQ(json[0]["samples_per_s"].get<double>(), 10.5);
  EXPECT_DOUBLE_EQ(json[0]["data_wait_fraction"].get<double>(), 0.01);
}

TEST(LoaderTuning, TuneOnAnImageFolderReportsEachWorkerCountAndPicksOne) {
  BATCHTUNE_REQUIRE_IMAGES();
  batchtune::testing::ImageFolder folder(3, 12);
  const auto r = batchtune::testing::run_cli(
      "tune --model mlp --input 3x16x16 --device cpu --memory-limit 96MiB --max-batch 4 "
      "--amp off --data imagefolder:" +
      folder.dir() + " --json -");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output.substr(r.output.find("\n{") + 1));
  ASSERT_TRUE(j["loader"].is_array());
  ASSERT_GE(j["loader"].size(), 2U);  // 0 and 1 workers at least
  EXPECT_EQ(j["loader"][0]["workers"], 0);
  for (const auto& row : j["loader"]) {
    EXPECT_GT(row["samples_per_s"].get<double>(), 0);
    EXPECT_GE(row["data_wait_fraction"].get<double>(), 0);
    EXPECT_LE(row["data_wait_fraction"].get<double>(), 1);
    EXPECT_FALSE(row["pin_memory"].get<bool>());  // CPU
  }
  bool found = false;
  for (const auto& row : j["loader"]) found |= row["workers"] == j["plan"]["workers"];
  EXPECT_TRUE(found) << j["plan"].dump();
  EXPECT_NE(j["loader_note"].get<std::string>().find("pinned memory does not apply"),
            std::string::npos);
  EXPECT_NE(r.output.find("3 classes"), std::string::npos);
  // The chosen setting's wait decides whether tune calls the run input-bound.
  double chosen = -1;
  for (const auto& row : j["loader"]) {
    if (row["workers"] == j["plan"]["workers"]) chosen = row["data_wait_fraction"].get<double>();
  }
  EXPECT_EQ(j["diagnosis"]["kind"] == "input-bound", chosen >= batchtune::kInputBoundWait)
      << j["diagnosis"].dump() << " " << chosen;

  const auto synthetic = batchtune::testing::run_cli(
      "tune --model mlp --input 3x16x16 --device cpu --memory-limit 96MiB --max-batch 2 "
      "--amp off --json -");
  ASSERT_EQ(synthetic.exit_code, 0) << synthetic.output;
  const auto s = nlohmann::json::parse(synthetic.output.substr(synthetic.output.find("\n{") + 1));
  EXPECT_TRUE(s["loader"].empty());
  EXPECT_NE(s["loader_note"].get<std::string>().find("skipped"), std::string::npos);
}

}  // namespace

namespace {

TEST(LoaderTuning, InputDiagnosisAboveAFewPercentOfTheStep) {
  EXPECT_EQ(batchtune::input_diagnosis(0.30, 0).rfind("input-bound", 0), 0U);
  EXPECT_EQ(batchtune::input_diagnosis(0.01, 2).rfind("not input-bound", 0), 0U);
}

}  // namespace

namespace {

TEST(LoaderTuning, TrainOnAnImageFolderSkipsACorruptFileWithTheFlagAndNamesItWithout) {
  BATCHTUNE_REQUIRE_IMAGES();
  batchtune::testing::ImageFolder folder(2, 8);
  const std::string bad = folder.files()[3];
  std::ofstream(bad, std::ios::binary | std::ios::trunc) << "broken";
  const std::string args = "train --model mlp --input 3x12x12 --device cpu --amp off "
                           "--batch-size 4 --epochs 1 --workers 2 --data imagefolder:" +
                           folder.dir();
  const auto failed = batchtune::testing::run_cli(args);
  EXPECT_EQ(failed.exit_code, 2) << failed.output;
  EXPECT_NE(failed.output.find(bad), std::string::npos) << failed.output;
  const auto skipped = batchtune::testing::run_cli(args + " --skip-bad-samples --json -");
  ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_NE(skipped.output.find("warning: skipped: " + bad), std::string::npos) << skipped.output;
  const auto j = nlohmann::json::parse(skipped.output.substr(skipped.output.find("\n{") + 1));
  EXPECT_EQ(j["skipped_samples"], 1);
  EXPECT_EQ(j["steps"], 4);
  EXPECT_NE(skipped.output.find("input-bound"), std::string::npos) << skipped.output;
}

}  // namespace
