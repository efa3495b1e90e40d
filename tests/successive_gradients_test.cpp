#include "batchtune/step/successive_gradients.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "batchtune/step/training_step.h"
#include "batchtune/step/workload.h"
#include "test_helpers.h"

namespace batchtune {
namespace {

/// One "parameter" whose gradient a test sets by hand.
struct Parameter {
  at::Tensor weight = at::zeros({3}, at::TensorOptions().requires_grad(true));
  std::vector<at::Tensor> list() const { return {weight}; }
  void set_grad(std::vector<double> values) {
    weight.mutable_grad() = at::tensor(values, at::TensorOptions().dtype(at::kFloat));
  }
};

double value(const at::Tensor& t) { return t.item<double>(); }

TEST(SuccessiveGradients, MeasuresEachStepAgainstThePreviousOne) {
  Parameter p;
  SuccessiveGradients successive;
  p.set_grad({1, 2, 2});  // |g1|² = 9
  EXPECT_FALSE(successive.measure(p.list(), 8).has_value()) << "nothing to compare with yet";
  EXPECT_TRUE(successive.holding());
  p.set_grad({3, 0, 4});  // |g2|² = 25, g1·g2 = 11
  const auto m = successive.measure(p.list(), 8);
  ASSERT_TRUE(m.has_value());
  EXPECT_DOUBLE_EQ(m->small_batch, 8);
  EXPECT_DOUBLE_EQ(m->big_batch, 16);
  EXPECT_NEAR(value(m->small_sq_norm), (9 + 25) / 2.0, 1e-5);
  EXPECT_NEAR(value(m->big_sq_norm), (9 + 25 + 2 * 11) / 4.0, 1e-5) << "|(g1 + g2) / 2|²";
  // The kept gradient is a copy: the optimizer setting it to none or
  // changing it leaves the next measurement with the right one.
  p.weight.mutable_grad().zero_();
  p.set_grad({0, 0, 1});  // against g2 = (3, 0, 4)
  const auto next = successive.measure(p.list(), 8);
  ASSERT_TRUE(next.has_value());
  EXPECT_NEAR(value(next->big_sq_norm), (3 * 3 + 5 * 5) / 4.0, 1e-5);
}

TEST(SuccessiveGradients, StepsOfUnequalSizesWeighTheirGradientsBySize) {
  // Token steps hold different numbers of tokens: the big gradient is the
  // two steps' mean per token, the small one sits at their harmonic mean.
  Parameter p;
  SuccessiveGradients successive;
  p.set_grad({1, 0, 0});
  successive.measure(p.list(), 100);
  p.set_grad({0, 1, 0});
  const auto m = successive.measure(p.list(), 300);
  ASSERT_TRUE(m.has_value());
  EXPECT_DOUBLE_EQ(m->small_batch, 2 / (1 / 100.0 + 1 / 300.0));
  EXPECT_DOUBLE_EQ(m->big_batch, 400);
  EXPECT_NEAR(value(m->big_sq_norm), 0.25 * 0.25 + 0.75 * 0.75, 1e-6);
}

TEST(SuccessiveGradients, GradientsOfAScaledLossAreMeasuredUnscaledWhateverTheScaleDid) {
  // fp16: step 1 at loss scale 1024, step 2 after the scaler halved it.
  Parameter p;
  SuccessiveGradients successive;
  p.set_grad({1024, 2048, 2048});  // 1024 × (1, 2, 2)
  successive.measure(p.list(), 8, at::full({1}, 1024.0));
  p.set_grad({1536, 0, 2048});  // 512 × (3, 0, 4)
  const auto m = successive.measure(p.list(), 8, at::full({1}, 512.0));
  ASSERT_TRUE(m.has_value());
  EXPECT_NEAR(value(m->small_sq_norm), (9 + 25) / 2.0, 1e-4);
  EXPECT_NEAR(value(m->big_sq_norm), (9 + 25 + 2 * 11) / 4.0, 1e-4);
}

TEST(SuccessiveGradients, AnotherModelOrAResetMeasuresNothing) {
  Parameter p;
  SuccessiveGradients successive;
  p.set_grad({1, 1, 1});
  successive.measure(p.list(), 4);
  Parameter other;
  other.weight.mutable_grad() = at::ones({5});
  EXPECT_FALSE(successive.measure(other.list(), 4).has_value()) << "other shapes";
  EXPECT_TRUE(successive.measure(other.list(), 4).has_value());
  successive.reset();
  EXPECT_FALSE(successive.holding());
  EXPECT_FALSE(successive.measure(other.list(), 4).has_value());
  EXPECT_THROW(successive.measure(other.list(), 0), c10::Error);
}

// Linear regression y = w*·x + ε at fixed parameters (see noise_scale_test):
// B_simple = (d(|δ|² + σ²) + |δ|²) / |δ|², here 8·1.25 + 1 = 11 for σ = 0.5
// and 8·5 + 1 = 41 for σ = 2.
double estimate_from_successive_steps(double sigma, int64_t batch, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
  at::Tensor delta = at::randn({8}, generator, at::kDouble);
  delta = delta / delta.norm();
  auto draws = at::make_generator<at::CPUGeneratorImpl>(seed);
  Parameter p;
  p.weight = at::zeros({8}, at::TensorOptions().dtype(at::kDouble).requires_grad(true));
  SuccessiveGradients successive;
  NoiseScaleTracker tracker(NoiseScaleOptions().decay(0.998));
  for (int step = 0; step < 2000; ++step) {
    const at::Tensor x = at::randn({batch, 8}, draws, at::kDouble);
    const at::Tensor residual = x.matmul(delta) - at::randn({batch}, draws, at::kDouble) * sigma;
    p.weight.mutable_grad() = (residual.unsqueeze(1) * x).mean(0);
    if (auto m = successive.measure({p.weight}, static_cast<double>(batch))) {
      tracker.add(std::move(*m));
    }
  }
  return tracker.noise_scale().value_or(0);
}

TEST(SuccessiveGradients, EstimateTheKnownNoiseScaleOfLinearRegression) {
  // Each measurement compares B with 2B only (the split compares B/2 with
  // B): a long average, as in noise_scale_test, brings it within 20 %.
  for (uint64_t seed : {1, 2}) {
    const double quiet = estimate_from_successive_steps(0.5, 16, seed);
    const double noisy = estimate_from_successive_steps(2.0, 16, seed);
    EXPECT_NEAR(quiet / 11, 1.0, 0.2) << "seed " << seed << ": " << quiet;
    EXPECT_NEAR(noisy / 41, 1.0, 0.2) << "seed " << seed << ": " << noisy;
  }
}

Workload mlp() {
  return Workload(WorkloadOptions().model("mlp").input_shape({16}).classes(4).seed(3));
}

TEST(SuccessiveGradients, AStepWithoutAccumulationMeasuresEveryStepAndLeavesItsGradient) {
  const auto data = testing::toy_data({16}, 64, 4, 4);
  const c10::Device cpu(c10::kCPU);
  Workload plain = mlp();
  Workload measured = mlp();
  TrainingStep plain_step(plain, cpu);
  TrainingStep measuring(measured, cpu,
                         StepOptions().measure_noise_scale(true).noise_from_successive_steps(true));
  for (int64_t step = 0; step < 4; ++step) {
    const Batch batch = data->get_batch({4 * step, 4 * step + 1, 4 * step + 2, 4 * step + 3});
    plain_step.backward(batch, step);
    measuring.backward(batch, step);
    const auto a = plain.model().parameters();
    const auto b = measured.model().parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(at::equal(a[i].grad(), b[i].grad())) << "step " << step << ", parameter " << i;
    }
    plain_step.apply();
    measuring.apply();
  }
  EXPECT_EQ(measuring.noise_scale().estimator().measurements(), 3) << "every step but the first";
  // With accumulation the micro-batches measure (and the copy is dropped).
  measuring.set_micro_batch_size(2);
  measuring.backward(data->get_batch({0, 1, 2, 3}), 4);
  EXPECT_EQ(measuring.noise_scale().estimator().measurements(), 4);
  measuring.set_micro_batch_size(4);
  measuring.backward(data->get_batch({0, 1, 2, 3}), 5);
  EXPECT_EQ(measuring.noise_scale().estimator().measurements(), 4)
      << "the step before accumulated: nothing kept to compare with";
}

TEST(SuccessiveGradients, ATokenStepOfOneMicroBatchMeasuresAgainstThePreviousStep) {
  const auto data = testing::toy_data({16}, 64, 4, 4);
  Workload w = mlp();
  TrainingStep step(w, c10::Device(c10::kCPU),
                    StepOptions().measure_noise_scale(true).noise_from_successive_steps(true));
  step.backward_weighted({data->get_batch({0, 1, 2})}, {1.0}, {30});
  step.apply();
  step.backward_weighted({data->get_batch({3, 4, 5, 6})}, {1.0}, {40});
  step.apply();
  EXPECT_EQ(step.noise_scale().estimator().measurements(), 1);
}

}  // namespace
}  // namespace batchtune
