#include "batchtune/plan/plan.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/workload.h"
#include "batchtune/tuning/plan_request.h"
#include "test_helpers.h"

namespace batchtune {
namespace {

TEST(Plan, LrScalesLinearlyForSgdAndBySquareRootForAdam) {
  const Plan sgd = make_plan(
      PlanOptions().micro_batch_size(64).target_batch(512).optimizer("sgd").base_lr(0.1).base_batch(256));
  EXPECT_EQ(sgd.lr_scaling, LrScaling::kLinear);
  EXPECT_EQ(sgd.accumulation_steps, 8);
  EXPECT_EQ(sgd.global_batch_size, 512);
  EXPECT_NEAR(sgd.lr, 0.2, 1e-12);
  EXPECT_EQ(sgd.warmup_steps, kWarmupStepsPerLrDoubling);  // lr doubled

  const Plan adam = make_plan(PlanOptions()
                                  .micro_batch_size(32)
                                  .target_batch(512)
                                  .optimizer("adam")
                                  .base_lr(1e-3)
                                  .base_batch(32));
  EXPECT_EQ(adam.lr_scaling, LrScaling::kSqrt);
  EXPECT_EQ(adam.accumulation_steps, 16);
  EXPECT_NEAR(adam.lr, 4e-3, 1e-15);  // sqrt(512 / 32) = 4
  EXPECT_EQ(adam.warmup_steps, 2 * kWarmupStepsPerLrDoubling);

  const Plan none = make_plan(
      PlanOptions().micro_batch_size(32).target_batch(512).lr_scaling("none").base_lr(1e-3));
  EXPECT_DOUBLE_EQ(none.lr, 1e-3);
  EXPECT_EQ(none.warmup_steps, 0);
}

TEST(Plan, WithoutTargetTheGlobalBatchIsTheMicroBatch) {
  const Plan plan = make_plan(PlanOptions().micro_batch_size(64).base_lr(1e-3));
  EXPECT_EQ(plan.accumulation_steps, 1);
  EXPECT_EQ(plan.global_batch_size, 64);
  EXPECT_DOUBLE_EQ(plan.lr, 1e-3);
  EXPECT_EQ(plan.warmup_steps, 0);
  EXPECT_EQ(plan.amp, AmpMode::kOff);
  EXPECT_GE(plan.reasons.size(), 4U);
}

TEST(Plan, APrimeTargetAboveTheMicroBatchTakesTheNearestAndSaysSo) {
  const Plan plan = make_plan(PlanOptions().micro_batch_size(64).target_batch(1009));
  EXPECT_EQ(plan.micro_batch_size, 64);
  EXPECT_EQ(plan.accumulation_steps, 16);
  EXPECT_EQ(plan.global_batch_size, 1024);
  const std::string why = plan.reason(PlanField::kGlobalBatch);
  EXPECT_NE(why.find("cannot be reached exactly"), std::string::npos) << why;
  EXPECT_NE(why.find("+1.5 %"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
}

TEST(Plan, TheTargetIsReachedExactlyByASmallerMicroBatchTheSweepSaysCostsLittle) {
  // 1000 = 50 x 20; 64 does not divide it. The sweep puts 50 at 1 % slower.
  const std::vector<MeasuredSpeed> speeds = {{16, 700}, {32, 900}, {50, 990}, {64, 1000}};
  const Plan plan =
      make_plan(PlanOptions().micro_batch_size(64).target_batch(1000).speeds(speeds));
  EXPECT_EQ(plan.micro_batch_size, 50);
  EXPECT_EQ(plan.accumulation_steps, 20);
  EXPECT_EQ(plan.global_batch_size, 1000);
  const std::string micro = plan.reason(PlanField::kMicroBatch);
  EXPECT_NE(micro.find("not the 64 chosen"), std::string::npos) << micro;
  EXPECT_NE(micro.find("1.0 % slower"), std::string::npos) << micro;

  // Past the tolerance, the nearest global batch with the chosen micro-batch.
  const Plan slow = make_plan(PlanOptions()
                                  .micro_batch_size(64)
                                  .target_batch(1000)
                                  .speeds({{32, 900}, {50, 950}, {64, 1000}}));
  EXPECT_EQ(slow.micro_batch_size, 64);
  EXPECT_EQ(slow.global_batch_size, 1024);
  EXPECT_NE(slow.reason(PlanField::kGlobalBatch).find("speed tolerance"), std::string::npos)
      << slow.reason(PlanField::kGlobalBatch);
  // A wider tolerance accepts it.
  EXPECT_EQ(make_plan(PlanOptions()
                          .micro_batch_size(64)
                          .target_batch(1000)
                          .speeds({{32, 900}, {50, 950}, {64, 1000}})
                          .speed_tolerance(0.06))
                .micro_batch_size,
            50);
}

TEST(Plan, WithoutSpeedsASmallerMicroBatchIsTakenDownToHalfOfTheChosen) {
  EXPECT_EQ(make_plan(PlanOptions().micro_batch_size(64).target_batch(500)).micro_batch_size,
            50);  // 500 = 50 x 10
  EXPECT_EQ(make_plan(PlanOptions().micro_batch_size(64).target_batch(94)).micro_batch_size,
            47);  // 94 = 47 x 2
  // 134 = 2 x 67: no divisor from 32 to 64, so the nearest.
  const Plan nearest = make_plan(PlanOptions().micro_batch_size(64).target_batch(134));
  EXPECT_EQ(nearest.micro_batch_size, 64);
  EXPECT_EQ(nearest.global_batch_size, 128);
}

TEST(Plan, ATargetBelowTheMicroBatchNeedsNoMore) {
  const Plan plan = make_plan(PlanOptions().micro_batch_size(825).target_batch(64));
  EXPECT_EQ(plan.micro_batch_size, 64);
  EXPECT_EQ(plan.accumulation_steps, 1);
  EXPECT_EQ(plan.global_batch_size, 64);
  EXPECT_NE(plan.reason(PlanField::kMicroBatch).find("needs no more"), std::string::npos)
      << plan.reason(PlanField::kMicroBatch);
}

TEST(Plan, TheTargetCountsEveryProcess) {
  // 1000 over 4 processes: 250 each = 50 x 5.
  const Plan plan =
      make_plan(PlanOptions().micro_batch_size(64).target_batch(1000).world_size(4));
  EXPECT_EQ(plan.micro_batch_size, 50);
  EXPECT_EQ(plan.accumulation_steps, 5);
  EXPECT_EQ(plan.global_batch_size, 1000);
  // Not a multiple of the processes: the nearest, saying why.
  const Plan odd = make_plan(PlanOptions().micro_batch_size(64).target_batch(1001).world_size(4));
  EXPECT_EQ(odd.global_batch_size % 4, 0);
  EXPECT_NE(odd.reason(PlanField::kGlobalBatch).find("not a multiple of the 4 processes"),
            std::string::npos)
      << odd.reason(PlanField::kGlobalBatch);
  // Fewer samples than a micro-batch on every process: a smaller micro-batch.
  const Plan tiny = make_plan(PlanOptions().micro_batch_size(64).target_batch(6).world_size(4));
  EXPECT_EQ(tiny.micro_batch_size, 2);
  EXPECT_EQ(tiny.global_batch_size, 8);
}

TEST(Plan, MultipleOfRoundsTheMicroBatchDownAndSaysWhatItCost) {
  const Plan plan = make_plan(
      PlanOptions().micro_batch_size(70).multiple_of(8).speeds({{32, 800}, {64, 990}, {70, 1000}}));
  EXPECT_EQ(plan.micro_batch_size, 64);
  const std::string why = plan.reason(PlanField::kMicroBatch);
  EXPECT_NE(why.find("multiple of 8"), std::string::npos) << why;
  EXPECT_NE(why.find("1.0 % slower"), std::string::npos) << why;
  // With a target, only multiples are taken: 256 = 64 x 4.
  const Plan target = make_plan(PlanOptions().micro_batch_size(70).multiple_of(8).target_batch(256));
  EXPECT_EQ(target.micro_batch_size, 64);
  EXPECT_EQ(target.accumulation_steps, 4);
  // Below the multiple: kept, and said.
  const Plan small = make_plan(PlanOptions().micro_batch_size(5).multiple_of(8));
  EXPECT_EQ(small.micro_batch_size, 5);
  EXPECT_NE(small.reason(PlanField::kMicroBatch).find("no multiple of it fits"),
            std::string::npos);
  EXPECT_THROW(make_plan(PlanOptions().micro_batch_size(5).multiple_of(0)), Error);
}

TEST(Plan, ATargetBelowTheMultipleKeepsTheMicroBatchAMultiple) {
  // plan --batch-size 20 --target-batch 7 --multiple-of 8 gave micro-batch 7.
  const Plan plan = make_plan(PlanOptions().micro_batch_size(20).target_batch(7).multiple_of(8));
  EXPECT_EQ(plan.micro_batch_size, 8) << plan.reason(PlanField::kMicroBatch);
  EXPECT_EQ(plan.accumulation_steps, 1);
  EXPECT_EQ(plan.global_batch_size, 8);
  EXPECT_EQ(plan.reason(PlanField::kMicroBatch).rfind("micro-batch 8, not the 20 chosen", 0), 0u)
      << plan.reason(PlanField::kMicroBatch);
  EXPECT_NE(plan.reason(PlanField::kMicroBatch).find("multiple of"), std::string::npos)
      << plan.reason(PlanField::kMicroBatch);
  // 20 of a multiple of 8 under a micro-batch of 32: 16, the multiple below.
  const Plan twenty = make_plan(PlanOptions().micro_batch_size(32).target_batch(20).multiple_of(8));
  EXPECT_EQ(twenty.micro_batch_size % 8, 0) << twenty.reason(PlanField::kMicroBatch);
}

TEST(Plan, TheLrIsScaledFromTheBatchItBelongsToAndNotWhenThatIsUnknown) {
  const Plan known = make_plan(PlanOptions()
                                   .micro_batch_size(256)
                                   .optimizer("sgd")
                                   .base_lr(0.1)
                                   .base_batch(64));
  EXPECT_NEAR(known.lr, 0.4, 1e-12);  // linear, 256 / 64
  EXPECT_GT(known.warmup_steps, 0);    // the lr rose
  const Plan unknown = make_plan(PlanOptions().micro_batch_size(256).optimizer("sgd").base_lr(0.1));
  EXPECT_DOUBLE_EQ(unknown.lr, 0.1);
  EXPECT_NE(unknown.reason(PlanField::kLr).find("unknown"), std::string::npos)
      << unknown.reason(PlanField::kLr);
}

TEST(Plan, WarmupRuleGrowsWithTheScaleFactor) {
  EXPECT_EQ(warmup_rule(1.0), 0);
  EXPECT_EQ(warmup_rule(0.5), 0);
  EXPECT_EQ(warmup_rule(2.0), 20);
  EXPECT_EQ(warmup_rule(8.0), 60);
  EXPECT_EQ(warmup_rule(std::sqrt(8.0)), 30);
  EXPECT_EQ(warmup_rule(1e30), 500);  // capped
  EXPECT_EQ(make_plan(PlanOptions().micro_batch_size(8).target_batch(64).warmup_steps(7))
                .warmup_steps,
            7);
}

TEST(Plan, ScheduleWarmsUpLinearlyThenStaysConstant) {
  EXPECT_DOUBLE_EQ(scheduled_lr(0.4, 4, 0), 0.1);
  EXPECT_DOUBLE_EQ(scheduled_lr(0.4, 4, 1), 0.2);
  EXPECT_DOUBLE_EQ(scheduled_lr(0.4, 4, 3), 0.4);
  EXPECT_DOUBLE_EQ(scheduled_lr(0.4, 4, 4), 0.4);
  EXPECT_DOUBLE_EQ(scheduled_lr(0.4, 4, 1000), 0.4);
  EXPECT_DOUBLE_EQ(scheduled_lr(0.4, 0, 0), 0.4);
}

TEST(Plan, BadOptionsNameTheFlag) {
  const auto message = [](const PlanOptions& o) {
    try {
      make_plan(o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(PlanOptions()).find("--batch-size"), std::string::npos);
  EXPECT_NE(message(PlanOptions().micro_batch_size(4).base_lr(0)).find("--base-lr"),
            std::string::npos);
  EXPECT_NE(message(PlanOptions().micro_batch_size(4).lr_scaling("cubic")).find("--lr-scaling"),
            std::string::npos);
}

TEST(Plan, BadOptionsAreOptionErrors) {
  try {
    make_plan(PlanOptions().micro_batch_size(4).warmup_steps(kMaxPlanCount + 1));
    FAIL() << "no error";
  } catch (const OptionError& e) {
    EXPECT_EQ(e.option(), Option::kWarmup);
    EXPECT_EQ(e.message(FrontEnd::kPython).rfind("warmup_steps: must be at most", 0), 0u)
        << e.message(FrontEnd::kPython);
  }
  try {
    make_plan(PlanOptions().micro_batch_size(4).base_lr(900).base_batch(1).target_batch(4096)
                  .lr_scaling("linear"));
    FAIL() << "no error";
  } catch (const OptionError& e) {
    EXPECT_EQ(e.option(), Option::kBaseLr);
    EXPECT_NE(e.message(FrontEnd::kPython).find("smaller base_lr or target_batch, or lr_scaling none"),
              std::string::npos)
        << e.message(FrontEnd::kPython);
  }
}

TEST(Plan, ReasonsNameOptionsAsTheFrontEndDoes) {
  const auto options = [](FrontEnd front_end) {
    return PlanOptions().front_end(front_end).micro_batch_size(60).multiple_of(8).target_batch(512)
        .base_lr(0.1);
  };
  const Plan cli = make_plan(options(FrontEnd::kCli));
  const Plan python = make_plan(options(FrontEnd::kPython));
  EXPECT_NE(cli.reason(PlanField::kGlobalBatch).find("--target-batch 512"), std::string::npos)
      << cli.reason(PlanField::kGlobalBatch);
  EXPECT_NE(python.reason(PlanField::kGlobalBatch).find("target_batch 512"), std::string::npos)
      << python.reason(PlanField::kGlobalBatch);
  EXPECT_NE(cli.reason(PlanField::kLr).find("give --base-batch"), std::string::npos)
      << cli.reason(PlanField::kLr);
  EXPECT_NE(python.reason(PlanField::kLr).find("(base_lr), not scaled"), std::string::npos)
      << python.reason(PlanField::kLr);
  EXPECT_NE(python.reason(PlanField::kLr).find("give base_batch"), std::string::npos)
      << python.reason(PlanField::kLr);
  for (const PlanReason& r : python.reasons) {
    EXPECT_EQ(r.text.find("--"), std::string::npos) << r.text;
  }
}

TEST(Plan, ReasonsSayWhereAValueCameFrom) {
  const Plan plan = make_plan(PlanOptions()
                                  .front_end(FrontEnd::kPython)
                                  .sources({{Option::kBaseLr, "the optimizer's lr"},
                                            {Option::kWarmup, "the plan p.json"}})
                                  .micro_batch_size(32)
                                  .target_batch(128)
                                  .base_lr(0.1)
                                  .base_batch(32)
                                  .warmup_steps(7));
  EXPECT_NE(plan.reason(PlanField::kLr).find("base lr 0.1 (the optimizer's lr) at batch 32"),
            std::string::npos)
      << plan.reason(PlanField::kLr);
  EXPECT_EQ(plan.reason(PlanField::kWarmup), "warm-up 7 steps: from the plan p.json");
}

TEST(Plan, JsonRoundTripKeepsEveryField) {
  Plan plan = make_plan(PlanOptions()
                            .micro_batch_size(48)
                            .target_batch(480)
                            .optimizer("sgd")
                            .base_lr(0.05)
                            .base_batch(96)
                            .amp(AmpMode::kBf16)
                            .amp_reason("amp bf16: test")
                            .workers(3)
                            .pin_memory(true)
                            .prefetch(4));
  plan.eval_micro_batch_size = 512;
  plan.warnings = {"lr not scaled: a test"};
  const nlohmann::json json = to_json(plan);
  for (const char* key : {"micro_batch_size", "accumulation_steps", "world_size",
                          "global_batch_size", "lr", "lr_scaling", "warmup_steps", "amp",
                          "workers", "pin_memory", "prefetch", "eval_micro_batch_size", "reasons",
                          "warnings", "workload"}) {
    EXPECT_TRUE(json.contains(key)) << key;
  }
  EXPECT_EQ(json.size(), 15U);
  EXPECT_EQ(json["eval_micro_batch_size"], 512);
  const Plan back = plan_from_json(nlohmann::json::parse(json.dump()), "test");
  EXPECT_EQ(to_json(back), json);
  // As `tune --json` writes it: inside a `plan` field.
  EXPECT_EQ(to_json(plan_from_json({{"plan", json}, {"other", 1}}, "test")), json);
}

std::string plan_file_error(const nlohmann::json& json, const std::string& raw = "") {
  const std::string path = ::testing::TempDir() + "batchtune_bad_plan.json";
  std::ofstream(path) << (raw.empty() ? json.dump() : raw);
  try {
    read_plan_file(path);
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  return "no error";
}

TEST(Plan, BadPlanFilesNameTheFileAndTheField) {
  const nlohmann::json good = to_json(make_plan(PlanOptions().micro_batch_size(8)));
  auto with = [&](const char* field, const nlohmann::json& value) {
    nlohmann::json j = good;
    j[field] = value;
    return j;
  };
  auto without = [&](const char* field) {
    nlohmann::json j = good;
    j.erase(field);
    return j;
  };
  EXPECT_NE(plan_file_error(without("lr")).find("'lr': missing"), std::string::npos);
  EXPECT_NE(plan_file_error(with("micro_batch_size", 0)).find("'micro_batch_size'"),
            std::string::npos);
  EXPECT_NE(plan_file_error(with("micro_batch_size", "8")).find("'micro_batch_size'"),
            std::string::npos);
  EXPECT_NE(plan_file_error(with("global_batch_size", 9)).find("'global_batch_size'"),
            std::string::npos);
  EXPECT_NE(plan_file_error(with("lr", -1)).find("'lr'"), std::string::npos);
  EXPECT_NE(plan_file_error(with("lr_scaling", "cubic")).find("'lr_scaling'"),
            std::string::npos);
  EXPECT_NE(plan_file_error(with("amp", "auto")).find("'amp'"), std::string::npos);
  EXPECT_NE(plan_file_error(with("pin_memory", 1)).find("'pin_memory'"), std::string::npos);
  EXPECT_NE(plan_file_error(with("warmup_steps", -3)).find("'warmup_steps'"),
            std::string::npos);
  EXPECT_NE(plan_file_error(with("reasons", 5)).find("'reasons'"), std::string::npos);
  EXPECT_NE(plan_file_error({}, "{\"micro_batch_size\": 8,").find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(plan_file_error({}, "[1, 2]").find("object"), std::string::npos);
  try {
    read_plan_file("/nonexistent/plan.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/plan.json"), std::string::npos);
  }
}

TEST(Plan, ATokenBudgetAndItsBucketsRoundTripAndAreChecked) {
  Plan plan = make_plan(PlanOptions().micro_batch_size(4));
  EXPECT_FALSE(to_json(plan).contains("token_budget")) << "only a plan for sequences has one";
  plan.token_budget = 2048;
  plan.length_buckets = {{16, 128}, {32, 64}, {512, 4}};
  const nlohmann::json json = to_json(plan);
  EXPECT_EQ(json["token_budget"], 2048);
  EXPECT_EQ(json["length_buckets"][2]["max_length"], 512);
  EXPECT_EQ(json["length_buckets"][2]["micro_batch_size"], 4);
  const Plan back = plan_from_json(nlohmann::json::parse(json.dump()), "test");
  EXPECT_EQ(back.token_budget, 2048);
  ASSERT_EQ(back.length_buckets.size(), 3u);
  EXPECT_EQ(back.length_buckets[1].max_length, 32);
  EXPECT_EQ(to_json(back), json);
  EXPECT_EQ(json["tokens_per_step"], 0) << "written with the budget, 0: the budget a process";
  plan.tokens_per_step = 6000;
  EXPECT_EQ(plan_from_json(nlohmann::json::parse(to_json(plan).dump()), "t").tokens_per_step, 6000);
  nlohmann::json older = json;  // a plan of a batchtune before tokens_per_step
  older.erase("tokens_per_step");
  EXPECT_EQ(plan_from_json(older, "older").tokens_per_step, 0);

  auto with = [&](const char* field, const nlohmann::json& value) {
    nlohmann::json j = json;
    j[field] = value;
    return j;
  };
  nlohmann::json no_buckets = json;
  no_buckets.erase("length_buckets");
  EXPECT_NE(plan_file_error(no_buckets).find("'length_buckets': missing"), std::string::npos);
  EXPECT_NE(plan_file_error(with("token_budget", 0)).find("'token_budget'"), std::string::npos);
  EXPECT_NE(plan_file_error(with("tokens_per_step", -1)).find("'tokens_per_step'"),
            std::string::npos);
  nlohmann::json stray = to_json(make_plan(PlanOptions().micro_batch_size(4)));
  stray["tokens_per_step"] = 100;
  EXPECT_NE(plan_file_error(stray).find("belongs to a token budget"), std::string::npos);
  EXPECT_NE(plan_file_error(with("length_buckets", 3)).find("'length_buckets'"),
            std::string::npos);
  EXPECT_NE(plan_file_error(with("length_buckets", nlohmann::json::array()))
                .find("at least one length bucket"),
            std::string::npos);
  const std::string falling = plan_file_error(with(
      "length_buckets", {{{"max_length", 64}, {"micro_batch_size", 4}},
                         {{"max_length", 32}, {"micro_batch_size", 4}}}));
  EXPECT_NE(falling.find("above the bucket before"), std::string::npos) << falling;
  const std::string over = plan_file_error(
      with("length_buckets", {{{"max_length", 512}, {"micro_batch_size", 5}}}));
  EXPECT_NE(over.find("pass the token_budget 2048"), std::string::npos) << over;
  const std::string missing = plan_file_error(
      with("length_buckets", {{{"max_length", 512}}}));
  EXPECT_NE(missing.find("'micro_batch_size': missing"), std::string::npos) << missing;
}

TEST(Plan, APlanForAnotherSizeOfTheSameModelIsRefusedNamingBothCounts) {
  // Two sizes of the built-in gpt share the name "gpt", not the memory.
  auto memory = make_device_memory(c10::Device(c10::kCPU), int64_t{1} << 30);
  Workload small(WorkloadOptions().model("gpt").gpt(GptOptions().layers(1).width(32)));
  Workload usual(WorkloadOptions().model("gpt"));
  const PlanWorkload planned = describe_workload(small, *memory, PlanRequest());
  const PlanWorkload current = describe_workload(usual, *memory, PlanRequest());
  ASSERT_EQ(planned.model, current.model);
  EXPECT_GT(planned.parameters, 0);
  EXPECT_NE(planned.parameters, current.parameters);
  EXPECT_NO_THROW(check_plan_workload(planned, planned, "--plan p.json", FrontEnd::kCli));
  const std::string message = testing::error_of(
      [&] { check_plan_workload(planned, current, "--plan p.json", FrontEnd::kCli); });
  EXPECT_NE(message.find("--plan p.json: the plan was made for gpt of " +
                         std::to_string(planned.parameters) + " parameters, this run's has " +
                         std::to_string(current.parameters)),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("--layers"), std::string::npos) << message;
  // Recorded in the plan file and read back; a plan without it is not compared.
  Plan plan = make_plan(PlanOptions().micro_batch_size(8));
  plan.workload = planned;
  EXPECT_EQ(plan_from_json(to_json(plan), "test").workload.parameters, planned.parameters);
  PlanWorkload unrecorded = planned;
  unrecorded.parameters = 0;
  EXPECT_NO_THROW(check_plan_workload(unrecorded, current, "--plan p.json", FrontEnd::kCli));
}

}  // namespace
}  // namespace batchtune
