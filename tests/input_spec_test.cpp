#include "batchtune/data/input_spec.h"

#include <gtest/gtest.h>

#include <string>

#include "batchtune/common/error.h"
#include "test_helpers.h"

namespace {

using batchtune::testing::error_of;

using namespace batchtune;


TEST(InputSpec, TodaysFlagsMeanOneFloatInputWithClasses) {
  const auto spec = parse_input_flags(InputFlags().inputs({"3x224x224"}).classes(1000));
  ASSERT_EQ(spec.inputs.size(), 1u);
  EXPECT_EQ(spec.inputs[0].shape, (std::vector<int64_t>{3, 224, 224}));
  EXPECT_EQ(spec.inputs[0].dtype, c10::kFloat);
  EXPECT_EQ(spec.target.kind, TargetKind::kClass);
  EXPECT_EQ(spec.target.classes, 1000);
  EXPECT_EQ(spec.loss, LossKind::kCrossEntropy);
  EXPECT_EQ(parse_input_flags(InputFlags()).target.classes, kDefaultClasses);
  const auto legacy = classification_spec({3, 224, 224}, 1000);
  EXPECT_EQ(describe(spec), describe(legacy));
}

TEST(InputSpec, TokenIdsWithVocabularyAreALanguageModel) {
  const auto spec =
      parse_input_flags(InputFlags().inputs({"int64:128"}).vocab(32000).classes(32000));
  EXPECT_EQ(spec.inputs[0].dtype, c10::kLong);
  EXPECT_EQ(spec.inputs[0].vocab, 32000);
  EXPECT_EQ(spec.target.kind, TargetKind::kToken);
  EXPECT_EQ(spec.target.shape, (std::vector<int64_t>{128}));
  EXPECT_EQ(spec.target.classes, 32000);
  EXPECT_EQ(describe(spec), describe(token_spec(128, 32000)));
  // Classes left out: the vocabulary. Fewer classes: a sequence classifier.
  EXPECT_EQ(parse_input_flags(InputFlags().inputs({"int64:16"}).vocab(100)).target.classes, 100);
  const auto classifier =
      parse_input_flags(InputFlags().inputs({"int64:16"}).vocab(100).classes(2));
  EXPECT_EQ(classifier.target.kind, TargetKind::kClass);
}

TEST(InputSpec, DtypesTargetsAndLosses) {
  EXPECT_EQ(parse_input_tensor("float16:3x8x8", 0).dtype, c10::kHalf);
  EXPECT_EQ(parse_input_tensor("bfloat16:4", 0).dtype, c10::kBFloat16);
  EXPECT_EQ(parse_input_tensor("float32:4", 0).dtype, c10::kFloat);
  const auto two = parse_input_flags(InputFlags().inputs({"int64:32", "float32:32"}).vocab(50));
  ASSERT_EQ(two.inputs.size(), 2u);
  EXPECT_EQ(two.inputs[1].name, "input1");
  EXPECT_EQ(two.target.shape, (std::vector<int64_t>{32}));
  const auto regression = parse_input_flags(InputFlags().inputs({"16"}).target("float:3"));
  EXPECT_EQ(regression.target.kind, TargetKind::kRegression);
  EXPECT_EQ(regression.target.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(regression.loss, LossKind::kMse);
  const auto own = parse_input_flags(InputFlags().inputs({"16"}).target("none"));
  EXPECT_EQ(own.loss, LossKind::kModel);
  EXPECT_EQ(parse_input_flags(InputFlags().loss("model")).loss, LossKind::kModel);
}

TEST(InputSpec, BadFlagsNameTheFlag) {
  const struct {
    InputFlags flags;
    const char* named;
  } cases[] = {
      {InputFlags().inputs({"int64:128"}), "--vocab"},
      {InputFlags().inputs({"int8:128"}), "--input"},
      {InputFlags().inputs({"3x0x3"}), "--input"},
      {InputFlags().inputs({"3x224x224"}).vocab(100), "--vocab"},
      {InputFlags().classes(1), "--classes"},
      {InputFlags().loss("hinge"), "--loss"},
      {InputFlags().loss("mse"), "--loss"},
      {InputFlags().target("float"), "--target"},
      {InputFlags().target("float:3").loss("ce"), "--loss"},
      {InputFlags().target("none").loss("ce"), "--loss"},
      {InputFlags().target("sideways"), "--target"},
      {InputFlags().target("token"), "--classes"},
      {InputFlags().inputs({}), "--input"},
  };
  for (const auto& c : cases) {
    const std::string message = error_of([&] { parse_input_flags(c.flags); });
    EXPECT_NE(message.find(c.named), std::string::npos) << c.named << ": " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(InputSpec, JsonSpecCoversSeveralInputs) {
  const auto spec = parse_input_spec_json(R"({
      "inputs": [{"name": "tokens", "shape": [64], "dtype": "int64", "vocab": 1000},
                 {"name": "mask", "shape": [64], "dtype": "bfloat16"}],
      "target": {"kind": "token"}})",
                                          "spec.json");
  ASSERT_EQ(spec.inputs.size(), 2u);
  EXPECT_EQ(spec.inputs[0].name, "tokens");
  EXPECT_EQ(spec.inputs[1].dtype, c10::kBFloat16);
  EXPECT_EQ(spec.target.kind, TargetKind::kToken);
  EXPECT_EQ(spec.target.classes, 1000);  // the vocabulary
  EXPECT_EQ(spec.target.shape, (std::vector<int64_t>{64}));
  EXPECT_EQ(spec.loss, LossKind::kCrossEntropy);

  const auto regression = parse_input_spec_json(
      R"({"inputs": [{"shape": [8]}], "target": {"kind": "float", "shape": [2]}})", "r.json");
  EXPECT_EQ(regression.inputs[0].dtype, c10::kFloat);
  EXPECT_EQ(regression.loss, LossKind::kMse);
  const auto own = parse_input_spec_json(
      R"({"inputs": [{"shape": [8]}], "target": "none", "loss": "model"})", "m.json");
  EXPECT_EQ(own.target.kind, TargetKind::kNone);
}

TEST(InputSpec, BadJsonNamesTheFileAndTheField) {
  const struct {
    const char* json;
    const char* named;
  } cases[] = {
      {"{", "not valid JSON"},
      {R"({"target": "none"})", "inputs"},
      {R"({"inputs": []})", "inputs"},
      {R"({"inputs": [{"dtype": "float32"}], "target": "none"})", "inputs[0].shape"},
      {R"({"inputs": [{"shape": [0]}], "target": "none"})", "inputs[0].shape"},
      {R"({"inputs": [{"shape": "3x8"}], "target": "none"})", "inputs[0].shape"},
      {R"({"inputs": [{"shape": [8], "dtype": 3}], "target": "none"})", "inputs[0].dtype"},
      {R"({"inputs": [{"shape": [8], "dtype": "int64"}], "target": "none"})", "inputs[0].vocab"},
      {R"({"inputs": [{"shape": [8], "colour": "red"}], "target": "none"})", "colour"},
      {R"({"inputs": [{"shape": [8]}]})", "target"},
      {R"({"inputs": [{"shape": [8]}], "target": {"kind": "class"}})", "target.classes"},
      {R"({"inputs": [{"shape": [8]}], "target": {"kind": "sideways"}})", "target.kind"},
      {R"({"inputs": [{"shape": [8]}], "target": "none", "loss": 5})", "loss"},
      {R"({"inputs": [{"shape": [8]}], "target": "none", "loss": "hinge"})", "loss"},
  };
  for (const auto& c : cases) {
    const std::string message = error_of([&] { parse_input_spec_json(c.json, "my.json"); });
    EXPECT_NE(message.find("my.json"), std::string::npos) << c.json << ": " << message;
    EXPECT_NE(message.find(c.named), std::string::npos) << c.json << ": " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_NE(error_of([] { load_input_spec("/nonexistent/spec.json"); }).find("--input-spec"),
            std::string::npos);
}

}  // namespace

namespace {

TEST(InputSpec, ALengthRangeHoldsTheLongestAndTheShortest) {
  const auto spec = parse_input_flags(InputFlags().inputs({"int64:16..512"}).vocab(256));
  ASSERT_EQ(spec.inputs.size(), 1u);
  EXPECT_EQ(spec.inputs[0].shape, (std::vector<int64_t>{512}));
  EXPECT_EQ(spec.inputs[0].min_length, 16);
  EXPECT_EQ(spec.target.shape, (std::vector<int64_t>{512})) << "targets at the longest";
  const auto range = length_range(spec);
  ASSERT_TRUE(range.has_value());
  EXPECT_EQ(range->min, 16);
  EXPECT_EQ(range->max, 512);
  EXPECT_EQ(sequence_length(spec), 512);
  EXPECT_NE(describe(spec).find("int64[16..512]"), std::string::npos) << describe(spec);

  const auto shortest = at_length(spec, 16);
  EXPECT_EQ(shortest.inputs[0].shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(shortest.target.shape, (std::vector<int64_t>{16}));
  EXPECT_FALSE(length_range(shortest).has_value());
  EXPECT_NE(error_of([&] { at_length(spec, 600); }).find("outside"), std::string::npos);

  // Features per frame after the range; a range of one length is fixed.
  const auto speech = parse_input_flags(InputFlags().inputs({"8..100x80"}).classes(10));
  EXPECT_EQ(speech.inputs[0].shape, (std::vector<int64_t>{100, 80}));
  EXPECT_EQ(speech.inputs[0].min_length, 8);
  EXPECT_FALSE(length_range(parse_input_flags(InputFlags().inputs({"int64:64..64"}).vocab(256))));
  // A fixed token spec is a sequence too (tokens/s), with no range.
  EXPECT_EQ(sequence_length(token_spec(128, 256)), 128);
  EXPECT_EQ(sequence_length(classification_spec({3, 32, 32}, 10)), 0);
}

TEST(InputSpec, BadLengthRangesSayHowToWriteOne) {
  const struct {
    const char* input;
    const char* expected;
  } cases[] = {
      {"int64:512..16", "runs backwards; write the shortest length first, like int64:16..512"},
      {"int64:0..512", "starts below 1"},
      {"int64:16..", "write MIN..MAX"},
      {"int64:..512", "write MIN..MAX"},
      {"int64:a..512", "write MIN..MAX"},
      {"int64:16...512", "write MIN..MAX"},
      {"4x16..512", "only the first dimension"},
  };
  for (const auto& c : cases) {
    const std::string message =
        error_of([&] { parse_input_flags(InputFlags().inputs({c.input}).vocab(256)); });
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.input << ": " << message;
    EXPECT_EQ(message.rfind("--input", 0), 0u) << c.input << ": " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
  }
}

TEST(InputSpec, JsonSpecTakesALengthRangeAsTheFirstDimension) {
  const auto spec = parse_input_spec_json(
      R"({"inputs": [{"name": "tokens", "shape": ["16..512"], "dtype": "int64", "vocab": 256}],
          "target": {"kind": "token"}})",
      "spec.json");
  EXPECT_EQ(spec.inputs[0].shape, (std::vector<int64_t>{512}));
  EXPECT_EQ(spec.inputs[0].min_length, 16);
  EXPECT_EQ(spec.target.shape, (std::vector<int64_t>{512}));
  const std::string backwards = error_of([] {
    parse_input_spec_json(R"({"inputs": [{"shape": ["512..16"], "dtype": "int64", "vocab": 9}],
                              "target": "token"})",
                          "spec.json");
  });
  EXPECT_NE(backwards.find("spec.json: inputs[0].shape"), std::string::npos) << backwards;
  EXPECT_NE(backwards.find("runs backwards"), std::string::npos) << backwards;
  const std::string not_a_range = error_of([] {
    parse_input_spec_json(R"({"inputs": [{"shape": ["512"], "dtype": "int64", "vocab": 9}],
                              "target": "token"})",
                          "spec.json");
  });
  EXPECT_NE(not_a_range.find("length range MIN..MAX"), std::string::npos) << not_a_range;
  const std::string two_ranges = error_of([] {
    parse_input_spec_json(
        R"({"inputs": [{"name": "a", "shape": ["16..512"], "dtype": "int64", "vocab": 9},
                       {"name": "b", "shape": ["8..512"]}], "target": "token"})",
        "spec.json");
  });
  EXPECT_NE(two_ranges.find("different length ranges"), std::string::npos) << two_ranges;
}

}  // namespace
