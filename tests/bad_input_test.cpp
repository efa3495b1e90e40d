// Bad input in files and data, across commands: every case must end with
// exit code 2, one line that names the input, and nothing written.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_runner.h"

namespace {

using batchtune::testing::run_cli;

std::string dir() { return ::testing::TempDir() + "batchtune_bad_input"; }

void write(const std::string& name, const std::string& content) {
  std::ofstream(dir() + "/" + name, std::ios::binary) << content;
}

std::string big_endian(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

/// A folder of Fashion-MNIST files with `images` as the training images.
void write_idx_dir(const std::string& name, const std::string& images) {
  const std::string d = dir() + "/" + name;
  ::mkdir(d.c_str(), 0755);
  const std::string labels = big_endian(2049) + big_endian(2) + std::string(2, '\1');
  std::ofstream(d + "/train-images-idx3-ubyte", std::ios::binary) << images;
  std::ofstream(d + "/train-labels-idx1-ubyte", std::ios::binary) << labels;
  std::ofstream(d + "/t10k-images-idx3-ubyte", std::ios::binary) << images;
  std::ofstream(d + "/t10k-labels-idx1-ubyte", std::ios::binary) << labels;
}

const std::string kPlan =
    R"("micro_batch_size": 8, "accumulation_steps": 1, "world_size": 1, "global_batch_size": 8,
       "lr": 0.001, "lr_scaling": "none", "warmup_steps": 0, "amp": "off", "workers": 0,
       "pin_memory": false, "prefetch": 2)";

class BadInputFiles : public ::testing::TestWithParam<std::pair<const char*, const char*>> {
 protected:
  static void SetUpTestSuite() {
    ::mkdir(dir().c_str(), 0755);
    write("plan_not_json.json", "{\"micro_batch_size\": 8,");
    write("plan_array.json", "[1, 2]");
    write("plan_missing_field.json", R"({"micro_batch_size": 8})");
    write("plan_wrong_type.json",
          "{" + std::string(kPlan).replace(kPlan.find("8,"), 2, "\"eight\",") + "}");
    write("plan_inconsistent.json",
          "{" + std::string(kPlan).replace(kPlan.find("\"global_batch_size\": 8"), 22,
                                           "\"global_batch_size\": 9") + "}");
    write("plan_bad_amp.json", "{" + std::string(kPlan).replace(kPlan.find("\"off\""), 5,
                                                                "\"fp8\"") + "}");
    // Nested 100,000 deep: the parser, dump() and the destructor recurse.
    write("plan_deep.json", std::string(100000, '[') + std::string(100000, ']'));
    write("spec_deep.json", R"({"inputs": )" + std::string(100000, '[') +
                                std::string(100000, ']') + "}");
    const auto plan_with = [&](const std::string& field, const std::string& value) {
      std::string plan = kPlan;
      const size_t at = plan.find("\"" + field + "\": ");
      const size_t from = plan.find(": ", at) + 2;
      return "{" + plan.replace(from, plan.find_first_of(",}", from) - from, value) + "}";
    };
    write("plan_workers.json", plan_with("workers", "100000"));
    write("plan_prefetch.json", plan_with("prefetch", "1000000"));
    write("plan_unsigned.json", plan_with("micro_batch_size", "18446744073709551615"));
    write("plan_lr_huge.json", plan_with("lr", "1e39"));
    // micro x accumulation overflows: each is in range, the product is not.
    write("plan_overflow.json",
          R"({"micro_batch_size": 1099511627776, "accumulation_steps": 1099511627776,
              "world_size": 1, "global_batch_size": 8, "lr": 0.001, "lr_scaling": "none",
              "warmup_steps": 0, "amp": "off", "workers": 0, "pin_memory": false,
              "prefetch": 2})");
    write("spec_classes_fraction.json",
          R"({"inputs": [{"shape": [3, 8, 8]}], "target": {"kind": "class", "classes": 10.5}})");
    write("spec_classes_unsigned.json",
          R"({"inputs": [{"shape": [3, 8, 8]}], "target": {"kind": "class", )"
          R"("classes": 18446744073709551615}})");
    write("spec_huge_shape.json",
          R"({"inputs": [{"shape": [65536, 65536, 65536]}], "target": {"kind": "class", )"
          R"("classes": 10}})");
    write("spec_not_json.json", "inputs: [3, 8, 8]");
    write("spec_bad_dtype.json", R"({"inputs": [{"shape": [3, 8, 8], "dtype": "float8"}]})");
    write("spec_unknown_key.json", R"({"inputs": [{"shape": [3, 8, 8]}], "batch": 4})");
    write("spec_empty.json", R"({"inputs": []})");
    write("model_garbage.pt", "this is not a TorchScript archive");
    write("model_empty.pt", "");
    const std::string header = big_endian(2051) + big_endian(2) + big_endian(28) + big_endian(28);
    write_idx_dir("idx_truncated", header + std::string(100, '\0'));
    write_idx_dir("idx_wrong_magic", big_endian(1234) + std::string(2 * 784 + 12, '\0'));
    write_idx_dir("idx_empty", "");
    ::mkdir((dir() + "/images_empty").c_str(), 0755);
    ::mkdir((dir() + "/images_one_class").c_str(), 0755);
    ::mkdir((dir() + "/images_one_class/cat").c_str(), 0755);
    write("images_one_class/cat/a.jpg", "not a jpeg");
  }
};

TEST_P(BadInputFiles, ExitTwoWithOneLineNamingTheInputAndWriteNothing) {
  std::string args = GetParam().first;
  for (size_t at; (at = args.find("{dir}")) != std::string::npos;) args.replace(at, 5, dir());
  const std::string json = dir() + "/out.json";
  std::remove(json.c_str());
  const auto r = run_cli(args + " --json " + json);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(GetParam().second), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  struct stat st {};
  EXPECT_NE(::stat(json.c_str(), &st), 0) << "a failed command wrote " << json;
}

INSTANTIATE_TEST_SUITE_P(
    Files, BadInputFiles,
    ::testing::Values(
        std::pair{"plan --plan {dir}/plan_not_json.json", "plan_not_json.json"},
        std::pair{"plan --plan {dir}/plan_array.json", "plan_array.json"},
        std::pair{"plan --plan {dir}/plan_missing_field.json", "plan_missing_field.json"},
        std::pair{"plan --plan {dir}/plan_wrong_type.json", "micro_batch_size"},
        std::pair{"plan --plan {dir}/plan_inconsistent.json", "global_batch_size"},
        std::pair{"plan --plan {dir}/plan_bad_amp.json", "amp"},
        std::pair{"plan --plan {dir}/nonexistent.json", "nonexistent.json"},
        std::pair{"plan --plan {dir}/plan_deep.json", "plan_deep.json"},
        std::pair{"plan --plan {dir}/plan_workers.json", "workers"},
        std::pair{"plan --plan {dir}/plan_prefetch.json", "prefetch"},
        std::pair{"plan --plan {dir}/plan_unsigned.json", "micro_batch_size"},
        std::pair{"plan --plan {dir}/plan_lr_huge.json", "lr"},
        std::pair{"plan --plan {dir}/plan_overflow.json", "global_batch_size"},
        std::pair{"train --plan {dir}/plan_workers.json --device cpu --steps 1 --model mlp",
                  "workers"},
        std::pair{"probe --batch-size 2 --input-spec {dir}/spec_deep.json", "spec_deep.json"},
        std::pair{"probe --batch-size 2 --input-spec {dir}/spec_classes_fraction.json",
                  "classes"},
        std::pair{"probe --batch-size 2 --input-spec {dir}/spec_classes_unsigned.json",
                  "classes"},
        std::pair{"probe --batch-size 2 --input-spec {dir}/spec_huge_shape.json", "shape"},
        std::pair{"probe --batch-size 2 --input-spec {dir}/spec_not_json.json",
                  "spec_not_json.json"},
        std::pair{"probe --batch-size 2 --input-spec {dir}/spec_bad_dtype.json", "dtype"},
        std::pair{"probe --batch-size 2 --input-spec {dir}/spec_unknown_key.json", "batch"},
        std::pair{"probe --batch-size 2 --input-spec {dir}/spec_empty.json", "inputs"},
        std::pair{"probe --batch-size 2 --input 3x8x8 --model {dir}/model_garbage.pt",
                  "model_garbage.pt"},
        std::pair{"probe --batch-size 2 --input 3x8x8 --model {dir}/model_empty.pt",
                  "model_empty.pt"},
        std::pair{"train --batch-size 2 --data fashion-mnist:{dir}/idx_truncated --device cpu "
                  "--steps 1 --model mlp --amp off",
                  "truncated"},
        std::pair{"train --batch-size 2 --data fashion-mnist:{dir}/idx_wrong_magic --device cpu "
                  "--steps 1 --model mlp --amp off",
                  "idx_wrong_magic"},
        std::pair{"train --batch-size 2 --data fashion-mnist:{dir}/idx_empty --device cpu "
                  "--steps 1 --model mlp --amp off",
                  "idx_empty"},
        std::pair{"train --batch-size 2 --data fashion-mnist:{dir}/no_such_dir --device cpu "
                  "--steps 1 --model mlp --amp off",
                  "no_such_dir"},
        std::pair{"train --batch-size 2 --data imagenet --device cpu --steps 1 --model mlp",
                  "--data"},
        std::pair{"train --plan {dir}/plan_missing_field.json --device cpu --steps 1 --model mlp",
                  "plan_missing_field.json"},
        std::pair{"train --batch-size 2 --data imagefolder:{dir}/no_such_dir --input 3x8x8 "
                  "--device cpu --steps 1 --model mlp",
                  "no_such_dir"},
        std::pair{"train --batch-size 2 --data imagefolder:{dir}/images_empty --input 3x8x8 "
                  "--device cpu --steps 1 --model mlp",
                  "images_empty"},
        std::pair{"train --batch-size 2 --data imagefolder:{dir}/images_one_class --input 3x8x8 "
                  "--device cpu --steps 1 --model mlp",
                  "images_one_class"}));

// A corrupt image is found when a batch decodes it, after the run has begun
// (and printed its plan): the error is still one line naming the file, the
// exit code 2, and no summary is written.
TEST(BadInputData, ACorruptImageStopsTrainingNamingTheFile) {
  ::mkdir(dir().c_str(), 0755);
  ::mkdir((dir() + "/images_corrupt").c_str(), 0755);
  for (const char* c : {"/images_corrupt/cat", "/images_corrupt/dog"}) {
    ::mkdir((dir() + c).c_str(), 0755);
  }
  write("images_corrupt/cat/broken.jpg", "\xff\xd8\xff not really a jpeg");
  write("images_corrupt/dog/broken.png", "\x89PNG\r\n\x1a\n truncated");
  const std::string json = dir() + "/corrupt.json";
  std::remove(json.c_str());
  const auto r = run_cli("train --batch-size 2 --data imagefolder:" + dir() +
                         "/images_corrupt --input 3x8x8 --device cpu --steps 1 --model mlp "
                         "--amp off --json " + json);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const std::string last = r.output.substr(r.output.rfind('\n', r.output.size() - 2) + 1);
  EXPECT_EQ(last.rfind("batchtune: ", 0), 0U) << r.output;
  EXPECT_NE(last.find("broken."), std::string::npos) << r.output;
  struct stat st {};
  EXPECT_NE(::stat(json.c_str(), &st), 0) << "a failed run wrote " << json;
}

/// torchrun's environment, wrong: each variable must be named.
struct BadEnvironment {
  std::vector<std::pair<const char*, const char*>> variables;
  const char* named;
};

class BadDistributedEnvironment : public ::testing::TestWithParam<BadEnvironment> {};

TEST_P(BadDistributedEnvironment, ExitsTwoNamingTheVariable) {
  const char* names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"};
  for (const char* name : names) ::unsetenv(name);
  for (const auto& [name, value] : GetParam().variables) ::setenv(name, value, 1);
  const auto r = run_cli("train --model mlp --input 1x8x8 --device cpu --batch-size 2 --steps 1 "
                         "--amp off --timeout 5");
  for (const char* name : names) ::unsetenv(name);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(GetParam().named), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

TEST(BadDistributedEnvironment, TextTrainingUnderTorchrunIsRefusedNotRunOnEveryRank) {
  // Each rank would train the whole run alone and write the same summary.
  const std::vector<std::pair<const char*, const char*>> torchrun = {
      {"WORLD_SIZE", "2"}, {"RANK", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29512"}};
  for (const auto& [name, value] : torchrun) ::setenv(name, value, 1);
  const auto r = run_cli("train --data text:/tmp --device cpu --steps 1 --amp off");
  for (const auto& [name, value] : torchrun) ::unsetenv(name);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--data text: trains in one process"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("WORLD_SIZE is 2"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    Torchrun, BadDistributedEnvironment,
    ::testing::Values(
        BadEnvironment{{{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"}},
                       "MASTER_PORT"},
        BadEnvironment{{{"WORLD_SIZE", "2"}, {"RANK", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                        {"MASTER_PORT", "29511"}},
                       "RANK"},
        BadEnvironment{{{"WORLD_SIZE", "two"}, {"RANK", "0"}}, "WORLD_SIZE"},
        BadEnvironment{{{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"},
                        {"MASTER_PORT", "99999"}},
                       "MASTER_PORT"}));

}  // namespace
