#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>

#include "batchtune/step/amp.h"
#include "batchtune/step/training_step.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/common/error.h"
#include "batchtune/step/trial.h"
#include "batchtune/step/workload.h"

namespace {

using namespace batchtune;

constexpr int64_t kLength = 32;
constexpr int64_t kVocab = 64;

WorkloadOptions small_gpt() {
  return WorkloadOptions().model("gpt").input_spec(token_spec(kLength, kVocab)).seed(11);
}

TEST(Gpt, OutputsLogitsPerToken) {
  Workload workload(small_gpt());
  const Batch batch = workload.synthetic_batch(3);
  ASSERT_EQ(batch.inputs.size(), 1u);
  EXPECT_EQ(batch.input().scalar_type(), at::kLong);
  EXPECT_EQ(batch.target.sizes(), (std::vector<int64_t>{3, kLength}));
  EXPECT_LT(batch.input().max().item<int64_t>(), kVocab);
  EXPECT_EQ(workload.model().forward(batch.input()).sizes(),
            (std::vector<int64_t>{3, kLength, kVocab}));
  // Shorter sequences than the longest work too.
  EXPECT_EQ(workload.model().forward(batch.input().narrow(1, 0, 5)).size(1), 5);
}

TEST(Gpt, AttentionIsCausal) {
  Workload workload(small_gpt());
  at::Tensor tokens = workload.synthetic_batch(1).input().clone();
  const at::Tensor before = workload.model().forward(tokens).detach();
  tokens[0][kLength - 1] = (tokens[0][kLength - 1].item<int64_t>() + 1) % kVocab;
  const at::Tensor after = workload.model().forward(tokens).detach();
  // Changing the last token changes no earlier position's logits.
  EXPECT_TRUE(torch::allclose(before.narrow(1, 0, kLength - 1), after.narrow(1, 0, kLength - 1),
                              1e-5, 1e-6));
  EXPECT_FALSE(torch::allclose(before.narrow(1, kLength - 1, 1), after.narrow(1, kLength - 1, 1)));
}

TEST(Gpt, SizesFollowTheOptions) {
  // Tied: embeddings + per block (2 layer norms, qkv, proj, mlp) + final norm.
  const int64_t w = 64, v = kVocab, t = kLength, layers = 2;
  const int64_t block = 2 * 2 * w + (w * 3 * w + 3 * w) + (w * w + w) + (w * 4 * w + 4 * w) +
                        (4 * w * w + w);
  const int64_t tied = v * w + t * w + layers * block + 2 * w;
  Workload workload(small_gpt());
  EXPECT_EQ(parameter_count(workload.model()), tied);
  Workload untied(small_gpt().gpt(GptOptions().tied_head(false)));
  EXPECT_EQ(parameter_count(untied.model()), tied + w * v);
  Workload deeper(small_gpt().gpt(GptOptions().layers(3).heads(4).width(32)));
  EXPECT_GT(parameter_count(deeper.model()), 0);
}

TEST(Gpt, TrainsOnSyntheticTokens) {
  Workload workload(small_gpt().lr(3e-3));
  const Batch batch = workload.synthetic_batch(8);
  const double first = TrainingStep(workload, c10::Device(c10::kCPU)).run(batch).item<double>();
  EXPECT_NEAR(first, std::log(static_cast<double>(kVocab)), 0.5);  // about uniform at start
  double last = first;
  for (int i = 0; i < 40; ++i) last = TrainingStep(workload, c10::Device(c10::kCPU)).run(batch).item<double>();
  EXPECT_LT(last, 0.7 * first) << first << " -> " << last;
}

TEST(Gpt, TrialFitsAndRunsOutOfTheBudget) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 64 << 20);
  Workload workload(small_gpt());
  TrialRunner runner(workload, *memory);
  EXPECT_TRUE(runner.run(TrialOptions().batch_size(4).steps(1)).fits);
  EXPECT_FALSE(runner.run(TrialOptions().batch_size(4096).steps(1)).fits);
}

/// The parameters' gradients of one backward pass of `workload` on `batch`.
std::vector<at::Tensor> gradients(Workload& workload, const Batch& batch, AmpMode amp = AmpMode::kOff) {
  workload.optimizer().zero_grad(true);
  at::Tensor loss;
  {
    AutocastGuard autocast(c10::kCPU, amp);
    loss = workload.compute_loss(batch);
  }
  loss.backward();
  std::vector<at::Tensor> grads;
  for (const auto& p : workload.model().parameters()) grads.push_back(p.grad().clone());
  return grads;
}

TEST(Gpt, CheckpointingGivesTheSameGradientsAsKeepingTheActivations) {
  for (AmpMode amp : {AmpMode::kOff, AmpMode::kBf16}) {
    Workload kept(small_gpt().gpt(GptOptions().layers(3)));
    Workload recomputed(small_gpt().gpt(GptOptions().layers(3)).checkpointing(true));
    const Batch batch = kept.synthetic_batch(4);
    const auto a = gradients(kept, batch, amp);
    const auto b = gradients(recomputed, batch, amp);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(b[i].defined()) << "parameter " << i << " got no gradient";
      // The same arithmetic, though bf16's recomputation may round apart.
      const double tolerance = amp == AmpMode::kOff ? 1e-6 : 1e-2;
      EXPECT_TRUE(torch::allclose(a[i], b[i], tolerance, tolerance * 1e-2))
          << amp_name(amp) << ", parameter " << i << ": " << (a[i] - b[i]).abs().max().item<double>();
    }
    EXPECT_FALSE(at::autocast::is_autocast_enabled(c10::kCPU)) << "the recomputation's autocast undone";
  }
}

TEST(Gpt, CheckpointingLowersTheStepsPeakAndFitsALargerBatch) {
  auto memory = make_device_memory(c10::Device(c10::kCPU), 256 << 20);
  const auto peak = [&](bool checkpointing) {
    Workload workload(small_gpt().gpt(GptOptions().layers(4)).checkpointing(checkpointing));
    TrialRunner runner(workload, *memory);
    const TrialResult r = runner.run(TrialOptions().batch_size(16).steps(1));
    EXPECT_TRUE(r.fits) << r.error;
    return r.peak_bytes;
  };
  const int64_t kept = peak(false);
  const int64_t recomputed = peak(true);
  EXPECT_LT(static_cast<double>(recomputed), 0.75 * static_cast<double>(kept))
      << kept << " -> " << recomputed;
}

TEST(Gpt, DefaultsAndBadOptions) {
  Workload defaults(WorkloadOptions().model("gpt"));  // token_spec(64, 256)
  EXPECT_EQ(defaults.input_spec().inputs.front().shape.front(), kGptDefaultLength);
  EXPECT_EQ(defaults.input_spec().target.classes, kGptDefaultVocab);
  EXPECT_THROW(Workload(small_gpt().gpt(GptOptions().width(30).heads(4))), Error);
  EXPECT_THROW(Workload(small_gpt().gpt(GptOptions().layers(0))), Error);
  EXPECT_THROW(Workload(WorkloadOptions().model("gpt").input_spec(
                   classification_spec({3, 8, 8}, 10))),
               Error);
  InputSpec fewer = token_spec(kLength, kVocab);
  fewer.target.classes = 10;
  EXPECT_THROW(Workload(WorkloadOptions().model("gpt").input_spec(fewer)), Error);
  // And the image models refuse token ids.
  EXPECT_THROW(Workload(WorkloadOptions().model("mlp").input_spec(token_spec(kLength, kVocab))),
               Error);
}

}  // namespace
