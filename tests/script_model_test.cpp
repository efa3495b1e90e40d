#include "batchtune/step/training_step.h"
#include "batchtune/models/script_model.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "batchtune/memory/device_memory.h"
#include "batchtune/common/error.h"
#include "batchtune/step/trial.h"
#include "batchtune/step/workload.h"
#include "test_helpers.h"
#include "cli_runner.h"

namespace {

using batchtune::testing::copies;
using batchtune::testing::error_of;
using batchtune::testing::expect_identical;

using namespace batchtune;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kFeatures = 3 * 8 * 8;
constexpr int64_t kHidden = 1024;  // wide, so that activations dominate memory
constexpr int64_t kClasses = 5;
constexpr int64_t kVocab = 50;
constexpr int64_t kTokens = 16;
constexpr int64_t kEmbedding = 32;

/// A file in the temp directory, removed at the end of the test.
struct TempFile {
  explicit TempFile(const std::string& name)
      : path((std::filesystem::temp_directory_path() /
              ("batchtune_test_" + std::to_string(getpid()) + "_" + name))
                 .string()) {}
  ~TempFile() { std::filesystem::remove(path); }
  std::string path;
};

at::Tensor trainable(at::Tensor t) { return t.requires_grad_(true); }

/// A scripted MLP over float images: [B, 3, 8, 8] -> [B, 5]. Its `steps`
/// buffer counts forwards, as batch norm's statistics change in training.
torch::jit::Module float_module(bool trainable_parameters = true) {
  torch::manual_seed(1);
  torch::jit::Module m("FloatNet");
  auto param = [&](at::Tensor t) { return trainable_parameters ? trainable(t) : t; };
  m.register_parameter("w1", param(torch::randn({kFeatures, kHidden}) * 0.05), false);
  m.register_parameter("b1", param(torch::zeros({kHidden})), false);
  m.register_parameter("w2", param(torch::randn({kHidden, kClasses}) * 0.05), false);
  m.register_buffer("steps", torch::zeros({1}));
  m.define(R"(
    def forward(self, x):
        self.steps.add_(1.0)
        h = torch.relu(torch.matmul(x.flatten(1), self.w1) + self.b1)
        return torch.matmul(h, self.w2)
  )");
  return m;
}

/// A scripted token model: [B, T] int64 -> logits [B, T, vocab].
torch::jit::Module token_module() {
  torch::manual_seed(2);
  torch::jit::Module m("TokenNet");
  m.register_parameter("embedding", trainable(torch::randn({kVocab, kEmbedding}) * 0.1), false);
  m.register_parameter("head", trainable(torch::randn({kEmbedding, kVocab}) * 0.1), false);
  m.define(R"(
    def forward(self, tokens):
        h = torch.tanh(torch.embedding(self.embedding, tokens))
        return torch.matmul(h, self.head)
  )");
  return m;
}

/// A model that computes its own loss from inputs and targets.
torch::jit::Module loss_module(bool scalar) {
  torch::manual_seed(3);
  torch::jit::Module m("LossNet");
  m.register_parameter("w", trainable(torch::randn({kFeatures, kClasses}) * 0.05), false);
  if (scalar) {
    m.define(R"(
      def forward(self, x, y):
          out = torch.matmul(x.flatten(1), self.w)
          return torch.cross_entropy_loss(out, y)
    )");
  } else {
    m.define(R"(
      def forward(self, x, y):
          return torch.matmul(x.flatten(1), self.w)
    )");
  }
  return m;
}

std::string saved(torch::jit::Module module, const TempFile& file) {
  module.save(file.path);
  return file.path;
}

WorkloadOptions float_options(const std::string& path) {
  return WorkloadOptions().model(path).input_spec(classification_spec({3, 8, 8}, kClasses)).seed(5);
}

WorkloadOptions token_options(const std::string& path) {
  return WorkloadOptions().model(path).input_spec(token_spec(kTokens, kVocab)).seed(5);
}


/// Trains `steps` steps on one batch; returns the first and the last loss.
std::pair<double, double> train_on_one_batch(Workload& workload, int steps) {
  const Batch batch = workload.synthetic_batch(16);
  const double first = TrainingStep(workload, c10::Device(c10::kCPU)).run(batch).item<double>();
  double last = first;
  for (int i = 1; i < steps; ++i) last = TrainingStep(workload, c10::Device(c10::kCPU)).run(batch).item<double>();
  return {first, last};
}

TEST(ScriptModel, LoadsParametersInOrderAndBuffers) {
  TempFile file("float.pt");
  auto model = load_script_model(saved(float_module(), file));
  const auto params = model->parameters();
  ASSERT_EQ(params.size(), 3u);
  EXPECT_EQ(params[0].sizes(), (std::vector<int64_t>{kFeatures, kHidden}));
  EXPECT_EQ(params[2].sizes(), (std::vector<int64_t>{kHidden, kClasses}));
  EXPECT_EQ(model->buffers().size(), 1u);
  EXPECT_NE(model->describe().find("TorchScript"), std::string::npos);
  EXPECT_EQ(model->forward(torch::randn({4, 3, 8, 8})).sizes(),
            (std::vector<int64_t>{4, kClasses}));
}

TEST(ScriptModel, FloatModelFitsAtOneSizeAndNotAtALargerOne) {
  TempFile file("float.pt");
  Workload workload(float_options(saved(float_module(), file)));
  auto memory = make_device_memory(c10::Device(c10::kCPU), 48 * kMiB);
  TrialRunner runner(workload, *memory);
  const TrialResult small = runner.run(TrialOptions().batch_size(64).steps(1));
  EXPECT_TRUE(small.fits) << small.error;
  // 8192 x 1024 floats of hidden activations alone are 32 MiB: the forward
  // runs out inside the TorchScript interpreter.
  const TrialResult big = runner.run(TrialOptions().batch_size(8192).steps(1));
  EXPECT_FALSE(big.fits);
  EXPECT_EQ(big.failure, TrialFailure::kOutOfMemory) << big.error;
  EXPECT_NE(big.error.find("out of memory"), std::string::npos) << big.error;
  EXPECT_EQ(big.error.find('\n'), std::string::npos) << big.error;
  EXPECT_TRUE(runner.run(TrialOptions().batch_size(64).steps(1)).fits);
}

TEST(ScriptModel, TokenModelFitsAtOneSizeAndNotAtALargerOne) {
  TempFile file("tokens.pt");
  Workload workload(token_options(saved(token_module(), file)));
  auto memory = make_device_memory(c10::Device(c10::kCPU), 16 * kMiB);
  TrialRunner runner(workload, *memory);
  const TrialResult small = runner.run(TrialOptions().batch_size(8).steps(1));
  EXPECT_TRUE(small.fits) << small.error;
  // 1024 x 16 x 50 logits are 3.1 MiB, and the step holds several copies.
  const TrialResult big = runner.run(TrialOptions().batch_size(4096).steps(1));
  EXPECT_FALSE(big.fits);
  EXPECT_GT(big.peak_bytes, small.peak_bytes);
}

TEST(ScriptModel, TrainingReducesTheLoss) {
  TempFile float_file("float.pt");
  Workload images(float_options(saved(float_module(), float_file)));
  const auto [first, last] = train_on_one_batch(images, 20);
  EXPECT_LT(last, 0.5 * first) << first << " -> " << last;

  TempFile token_file("tokens.pt");
  Workload tokens(token_options(saved(token_module(), token_file)).lr(1e-2));
  const auto [token_first, token_last] = train_on_one_batch(tokens, 30);
  EXPECT_LT(token_last, 0.8 * token_first) << token_first << " -> " << token_last;
}

TEST(ScriptModel, ModelsOwnLossTrains) {
  TempFile file("loss.pt");
  InputSpec spec = classification_spec({3, 8, 8}, kClasses);
  spec.loss = LossKind::kModel;
  Workload workload(WorkloadOptions().model(saved(loss_module(true), file)).input_spec(spec).lr(1e-2));
  const auto [first, last] = train_on_one_batch(workload, 20);
  EXPECT_LT(last, 0.8 * first) << first << " -> " << last;
}

TEST(ScriptModel, SeveralInputsOfOtherDtypes) {
  torch::manual_seed(4);
  torch::jit::Module m("MaskedTokenNet");
  m.register_parameter("embedding", trainable(torch::randn({kVocab, kEmbedding}) * 0.1), false);
  m.register_parameter("head", trainable(torch::randn({kEmbedding, kVocab}) * 0.1), false);
  m.define(R"(
    def forward(self, tokens, mask):
        h = torch.tanh(torch.embedding(self.embedding, tokens)) * mask.float().unsqueeze(-1)
        return torch.matmul(h, self.head)
  )");
  TempFile file("masked.pt");
  InputSpec spec = token_spec(kTokens, kVocab);
  spec.inputs.push_back({{kTokens}, c10::kBFloat16, 0, "mask"});
  Workload workload(WorkloadOptions().model(saved(m, file)).input_spec(spec).lr(1e-2));
  const Batch batch = workload.synthetic_batch(4);
  ASSERT_EQ(batch.inputs.size(), 2u);
  EXPECT_EQ(batch.inputs[0].scalar_type(), at::kLong);
  EXPECT_EQ(batch.inputs[1].scalar_type(), at::kBFloat16);
  EXPECT_EQ(batch.inputs[1].sizes(), (std::vector<int64_t>{4, kTokens}));
  const auto [first, last] = train_on_one_batch(workload, 20);
  EXPECT_LT(last, first);
}

TEST(ScriptModel, TrialLeavesNoTrace) {
  TempFile file("float.pt");
  Workload workload(float_options(saved(float_module(), file)));
  auto memory = make_device_memory(c10::Device(c10::kCPU), 256 * kMiB);
  TrainingStep(workload, c10::Device(c10::kCPU)).run(workload.synthetic_batch(4));  // optimizer state exists already
  const auto params = copies(workload.model().parameters());
  const auto buffers = copies(workload.model().buffers());
  std::vector<torch::Tensor> state;
  for (const auto& p : workload.model().parameters()) {
    auto& adam = static_cast<torch::optim::AdamParamState&>(
        *workload.optimizer().state().at(p.unsafeGetTensorImpl()));
    state.push_back(adam.exp_avg().clone());
    state.push_back(adam.exp_avg_sq().clone());
  }
  const int64_t live = memory->live_bytes();

  TrialRunner runner(workload, *memory);
  for (int64_t batch : {16, 1 << 20}) {  // one that fits, one that runs out
    runner.run(TrialOptions().batch_size(batch).steps(2));
    expect_identical(workload.model().parameters(), params);
    expect_identical(workload.model().buffers(), buffers);
    EXPECT_EQ(memory->live_bytes(), live);
    std::vector<torch::Tensor> after;
    for (const auto& p : workload.model().parameters()) {
      EXPECT_FALSE(p.grad().defined());
      auto& adam = static_cast<torch::optim::AdamParamState&>(
          *workload.optimizer().state().at(p.unsafeGetTensorImpl()));
      after.push_back(adam.exp_avg().clone());
      after.push_back(adam.exp_avg_sq().clone());
    }
    expect_identical(after, state);
  }
}

TEST(ScriptModel, GraphExecutorOptimisationStillTrains) {
  TempFile file("float.pt");
  auto model = load_script_model(saved(float_module(), file),
                                 ScriptModelOptions().optimize_graph(true));
  Workload workload(float_options(file.path), std::move(model));
  const auto [first, last] = train_on_one_batch(workload, 10);
  EXPECT_LT(last, first);
}


TEST(ScriptModel, ClearErrors) {
  TempFile text("notes.pt");
  std::ofstream(text.path) << "not a model\n";
  auto message = error_of([&] { load_script_model(text.path); });
  EXPECT_NE(message.find("not a TorchScript archive"), std::string::npos) << message;
  EXPECT_NE(message.find(text.path), std::string::npos) << message;

  message = error_of([&] { load_script_model("/nonexistent/model.pt"); });
  EXPECT_NE(message.find("no such file"), std::string::npos) << message;

  TempFile frozen("frozen.pt");
  message = error_of([&] { load_script_model(saved(float_module(false), frozen)); });
  EXPECT_NE(message.find("no trainable parameters"), std::string::npos) << message;

  // A forward that does not take the spec's inputs: 3x16x16 images into a
  // layer made for 3x8x8. LibTorch names both shapes.
  TempFile file("float.pt");
  message = error_of([&] {
    Workload(WorkloadOptions().model(saved(float_module(), file)).input_spec(
        classification_spec({3, 16, 16}, kClasses)));
  });
  EXPECT_NE(message.find("does not accept the inputs float32[2, 3, 16, 16]"), std::string::npos)
      << message;
  EXPECT_NE(message.find("Tensor x) -> Tensor"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("2x768 and 192x1024"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;

  // Two inputs to a forward that takes one.
  InputSpec two = classification_spec({3, 8, 8}, kClasses);
  two.inputs.push_back(two.inputs.front());
  message = error_of([&] { Workload(WorkloadOptions().model(file.path).input_spec(two)); });
  EXPECT_NE(message.find("does not accept"), std::string::npos) << message;

  // Outputs that do not suit the targets: 5 classes, 7 asked for.
  message = error_of([&] {
    Workload(WorkloadOptions().model(file.path).input_spec(classification_spec({3, 8, 8}, 7)));
  });
  EXPECT_NE(message.find("[2, 5]"), std::string::npos) << message;
  EXPECT_NE(message.find("[2, 7]"), std::string::npos) << message;

  // A "loss" that is not a scalar.
  TempFile not_scalar("not_scalar.pt");
  InputSpec own = classification_spec({3, 8, 8}, kClasses);
  own.loss = LossKind::kModel;
  message = error_of([&] {
    Workload(WorkloadOptions().model(saved(loss_module(false), not_scalar)).input_spec(own));
  });
  EXPECT_NE(message.find("must be a float scalar"), std::string::npos) << message;
}

TEST(ScriptModel, CliTrainsAFileAndNamesBadFiles) {
  TempFile file("cli.pt");
  saved(token_module(), file);
  const auto fits = batchtune::testing::run_cli(
      fmt::format("probe --model {} --input int64:{} --vocab {} --batch-size 4 --steps 1 "
                  "--memory-limit 64MiB --device cpu --json -",
                  file.path, kTokens, kVocab));
  ASSERT_EQ(fits.exit_code, 0) << fits.output;
  EXPECT_NE(fits.output.find("\"fits\": true"), std::string::npos) << fits.output;

  TempFile text("notes.pt");
  std::ofstream(text.path) << "not a model\n";
  for (const std::string& args :
       {fmt::format("probe --model {} --batch-size 4", text.path),
        fmt::format("probe --model {} --input 3x8x8 --batch-size 4", file.path),
        std::string("probe --model /nonexistent/model.pt --batch-size 4")}) {
    const auto r = batchtune::testing::run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("--model"), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
}

}  // namespace
