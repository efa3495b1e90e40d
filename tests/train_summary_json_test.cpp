#include "batchtune/training/train_summary_json.h"

#include <gtest/gtest.h>

#include "batchtune/training/batch_adapter.h"

namespace batchtune {
namespace {

TrainSummary token_run_summary() {
  TrainSummary s;
  s.steps = 12;
  s.samples = 300;
  s.epochs = 1.5;
  s.final_loss = 2.25;
  s.test_accuracy = 0.5;
  s.oom_recoveries = 1;
  s.skipped_steps = 2;
  s.loss_scale = 1024;
  s.micro_batch_size = 8;
  s.accumulation_steps = 3;
  s.global_batch_size = 24;
  s.world_size = 2;
  s.seconds = 4.5;
  s.samples_per_s = 66.5;
  s.tokens = 9000;
  s.tokens_per_s = 2000;
  s.padded_tokens = 12000;
  s.token_budget = 4096;
  s.target_tokens = 1000;
  s.micro_batches = 36;
  s.data_wait_fraction = 0.125;
  s.resumed_from_step = 4;
  s.complete = false;
  s.interrupted_by = "SIGTERM";
  s.noise_scale = 300;
  s.target = TrainTarget{"train_loss", 2.5};
  s.target_reached = true;
  s.steps_to_target = 11;
  s.seconds_to_target = 4.0;
  s.samples_to_target = 275;
  s.time_limit_reached = true;
  BatchChange start;
  start.step = 0;
  start.global_batch_size = 24;
  start.micro_batch_size = 8;
  start.accumulation_steps = 3;
  start.lr = 0.1;
  start.reason = "the start";
  s.batch_schedule.push_back(start);
  return s;
}

TEST(TrainSummaryJson, OneWriterReadsBackAsItWasWritten) {
  const nlohmann::json j = to_json(token_run_summary());
  EXPECT_EQ(to_json(summary_from_json(j)), j);
  EXPECT_EQ(j["target"]["reached"], true);
  EXPECT_EQ(j["interrupted_by"], "SIGTERM");
  EXPECT_EQ(j["resumed_from_step"], 4);
  EXPECT_DOUBLE_EQ(j["padding_share"].get<double>(), 0.25);
  EXPECT_EQ(j["batch_schedule"].size(), 1U);
}

TEST(TrainSummaryJson, AFreshRunWritesOnlyWhatApplies) {
  TrainSummary s;
  s.steps = 3;
  const nlohmann::json j = to_json(s);
  EXPECT_TRUE(j["interrupted_by"].is_null());
  EXPECT_TRUE(j["tokens_per_s"].is_null());
  EXPECT_TRUE(j["target"].is_null());
  for (const char* key : {"tokens", "padded_tokens", "batch_schedule", "resumed_from_step",
                          "time_limit_reached", "already_finished"}) {
    EXPECT_FALSE(j.contains(key)) << key;
  }
  EXPECT_EQ(to_json(summary_from_json(j)), j);
}

TEST(TrainSummaryJson, AnUnresolvedNoiseScaleIsNullBesideItsNote) {
  TrainSummary s;
  s.steps = 3;
  s.noise_scale_note = "noise scale unresolved: after 3 measurements ...";
  const nlohmann::json j = to_json(s);
  EXPECT_TRUE(j["noise_scale"].is_null());
  EXPECT_EQ(j["noise_scale_note"], s.noise_scale_note);
  EXPECT_EQ(to_json(summary_from_json(j)), j);
  EXPECT_TRUE(to_json(token_run_summary())["noise_scale_note"].is_null()) << "measured: no note";
}

TEST(TrainSummaryJson, ReadsTheSummaryOfAnEarlierCheckpoint) {
  // As checkpoints stored it before the report's writer was theirs too.
  const nlohmann::json old = {
      {"steps", 5},          {"batch_schedule", nlohmann::json::array()},
      {"samples", 40},       {"epochs", 0.5},
      {"final_loss", 1.5},   {"test_accuracy", nullptr},
      {"oom_recoveries", 0}, {"micro_batch_size", 8},
      {"accumulation_steps", 1}, {"global_batch_size", 8},
      {"world_size", 1},     {"skipped_steps", 0},
      {"seconds", 2.0},      {"samples_per_s", 20.0},
      {"data_wait_fraction", 0.0}, {"resumed_from_step", 0},
      {"complete", true},    {"interrupted_by", ""},
      {"noise_scale", nullptr},
      {"target", {{"metric", "test_accuracy"}, {"value", 0.85}}},
      {"target_reached", true}, {"steps_to_target", 5},
      {"seconds_to_target", 2.0}, {"samples_to_target", 40}};
  const TrainSummary s = summary_from_json(old);
  EXPECT_EQ(s.steps, 5);
  EXPECT_TRUE(s.interrupted_by.empty());
  ASSERT_TRUE(s.target.has_value());
  EXPECT_TRUE(s.target_reached);
  EXPECT_EQ(s.steps_to_target, 5);
  EXPECT_TRUE(s.batch_schedule.empty());
}

}  // namespace
}  // namespace batchtune
