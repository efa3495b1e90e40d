#include "batchtune/step/successive_gradients.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <optional>

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

TEST(SuccessiveGradients, MeasuresEachStepAgainstTheTwoBefore) {
  Parameter p;
  SuccessiveGradients successive;
  p.set_grad({1, 2, 2});  // |g1|² = 9
  EXPECT_FALSE(successive.measure(p.list(), 8).has_value()) << "nothing to compare with yet";
  EXPECT_TRUE(successive.holding());
  p.set_grad({3, 0, 4});  // |g2|² = 25
  EXPECT_FALSE(successive.measure(p.list(), 8).has_value()) << "one step before is not enough";
  p.set_grad({0, 0, 1});  // |g3|² = 1
  const auto m = successive.measure(p.list(), 8);
  ASSERT_TRUE(m.has_value());
  // g1 − 2·g2 + g3 = (−5, 2, −5): |.|² = 54, so tr(Σ) = 54 / (6/8) = 72.
  EXPECT_DOUBLE_EQ(m->small_batch, 8);
  EXPECT_DOUBLE_EQ(m->big_batch, 24);
  EXPECT_NEAR(value(m->small_sq_norm), (9 + 25 + 1) / 3.0, 1e-5);
  const double trace =
      (value(m->small_sq_norm) - value(m->big_sq_norm)) / (1 / m->small_batch - 1 / m->big_batch);
  EXPECT_NEAR(trace, 72, 1e-3);
  // The kept gradients are copies: the optimizer setting the gradient to
  // none or changing it leaves the next measurement with the right ones.
  p.weight.mutable_grad().zero_();
  p.set_grad({1, 0, 0});  // g2 − 2·g3 + g4 = (4, 0, 2): 20 / (6/8)
  const auto next = successive.measure(p.list(), 8);
  ASSERT_TRUE(next.has_value());
  EXPECT_NEAR((value(next->small_sq_norm) - value(next->big_sq_norm)) / (1 / 8.0 - 1 / 24.0),
              20 / 0.75, 1e-3);
}

TEST(SuccessiveGradients, AGradientThatDriftsSteadilyIsNotCountedAsNoise) {
  // The same gradient plus a change of d a step (the parameters moving):
  // the difference of two steps reads d as noise, the second difference
  // cancels it.
  Parameter p;
  SuccessiveGradients successive;
  std::optional<NoiseMeasurement> m;
  for (double t : {0.0, 1.0, 2.0}) {
    p.set_grad({1 + 0.5 * t, 2, 2 - 0.25 * t});
    m = successive.measure(p.list(), 64);
  }
  ASSERT_TRUE(m.has_value());
  EXPECT_NEAR(value(m->small_sq_norm) - value(m->big_sq_norm), 0, 1e-5) << "no noise at all";
}

TEST(SuccessiveGradients, StepsOfUnequalSizesMeasureAtTheirHarmonicMean) {
  // Token steps hold different numbers of tokens: the squared norms sit at
  // the harmonic mean of the sizes, the noise of the second difference
  // weighs each step by 1/n.
  Parameter p;
  SuccessiveGradients successive;
  p.set_grad({1, 0, 0});
  successive.measure(p.list(), 100);
  p.set_grad({0, 1, 0});
  successive.measure(p.list(), 300);
  p.set_grad({0, 0, 1});
  const auto m = successive.measure(p.list(), 200);
  ASSERT_TRUE(m.has_value());
  const double small = 3 / (1 / 100.0 + 1 / 300.0 + 1 / 200.0);
  EXPECT_DOUBLE_EQ(m->small_batch, small);
  EXPECT_DOUBLE_EQ(m->big_batch, 600);
  const double trace = (1 + 4 + 1) / (1 / 100.0 + 4 / 300.0 + 1 / 200.0);
  EXPECT_NEAR(value(m->small_sq_norm) - value(m->big_sq_norm), trace * (1 / small - 1 / 600.0),
              1e-6);
}

TEST(SuccessiveGradients, GradientsOfAScaledLossAreMeasuredUnscaledWhateverTheScaleDid) {
  // fp16: the steps at loss scales 1024, 512 and 2048, as a scaler moves.
  Parameter p;
  Parameter unscaled;
  SuccessiveGradients successive;
  SuccessiveGradients reference;
  const std::vector<std::vector<double>> grads = {{1, 2, 2}, {3, 0, 4}, {0, 0, 1}};
  const std::vector<double> scales = {1024, 512, 2048};
  std::optional<NoiseMeasurement> m;
  std::optional<NoiseMeasurement> expected;
  for (size_t i = 0; i < grads.size(); ++i) {
    std::vector<double> scaled;
    for (double g : grads[i]) scaled.push_back(g * scales[i]);
    p.set_grad(scaled);
    m = successive.measure(p.list(), 8, at::full({1}, scales[i]));
    unscaled.set_grad(grads[i]);
    expected = reference.measure(unscaled.list(), 8);
  }
  ASSERT_TRUE(m.has_value() && expected.has_value());
  EXPECT_NEAR(value(m->small_sq_norm), value(expected->small_sq_norm), 1e-4);
  EXPECT_NEAR(value(m->big_sq_norm), value(expected->big_sq_norm), 1e-4);
}

TEST(SuccessiveGradients, AnotherModelOrAResetMeasuresNothing) {
  Parameter p;
  SuccessiveGradients successive;
  p.set_grad({1, 1, 1});
  successive.measure(p.list(), 4);
  successive.measure(p.list(), 4);
  Parameter other;
  other.weight.mutable_grad() = at::ones({5});
  EXPECT_FALSE(successive.measure(other.list(), 4).has_value()) << "other shapes";
  EXPECT_FALSE(successive.measure(other.list(), 4).has_value());
  EXPECT_TRUE(successive.measure(other.list(), 4).has_value());
  successive.reset();
  EXPECT_FALSE(successive.holding());
  EXPECT_FALSE(successive.measure(other.list(), 4).has_value());
  EXPECT_FALSE(successive.measure(other.list(), 4).has_value());
  EXPECT_THROW(successive.measure(other.list(), 0), c10::Error);
}

TEST(SuccessiveGradients, ItsStateRestoredMeasuresTheNextStepAsTheRunWould) {
  Parameter p;
  SuccessiveGradients run;
  p.set_grad({1, 2, 2});
  run.measure(p.list(), 8);
  p.set_grad({3, 0, 4});
  run.measure(p.list(), 8);
  // A checkpoint holds copies (the kept tensors are reused in place).
  SuccessiveGradients::State copy = run.state();
  for (SuccessiveGradients::Kept* kept : {&copy.previous, &copy.earlier}) {
    for (at::Tensor& t : kept->gradient) t = t.clone();
  }
  SuccessiveGradients resumed;
  resumed.load_state(std::move(copy));
  p.set_grad({0, 0, 1});
  const auto a = run.measure(p.list(), 8);
  const auto b = resumed.measure(p.list(), 8);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_NEAR(value(a->big_sq_norm), value(b->big_sq_norm), 1e-6);
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
  // Each measurement compares three steps of B (the split compares B/2
  // with B): a long average, as in noise_scale_test, brings it within 20 %.
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
  const testing::OneThread one_thread;  // two runs compared bit for bit
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
  EXPECT_EQ(measuring.noise_scale().estimator().measurements(), 2)
      << "every step but the first two";
  // With accumulation the micro-batches measure (and the copies are dropped).
  measuring.set_micro_batch_size(2);
  measuring.backward(data->get_batch({0, 1, 2, 3}), 4);
  EXPECT_EQ(measuring.noise_scale().estimator().measurements(), 3);
  measuring.set_micro_batch_size(4);
  measuring.backward(data->get_batch({0, 1, 2, 3}), 5);
  EXPECT_EQ(measuring.noise_scale().estimator().measurements(), 3)
      << "the step before accumulated: nothing kept to compare with";
}

TEST(SuccessiveGradients, ATokenStepOfOneMicroBatchMeasuresAgainstThePreviousSteps) {
  const auto data = testing::toy_data({16}, 64, 4, 4);
  Workload w = mlp();
  TrainingStep step(w, c10::Device(c10::kCPU),
                    StepOptions().measure_noise_scale(true).noise_from_successive_steps(true));
  step.backward_weighted({data->get_batch({0, 1, 2})}, {1.0}, {30});
  step.apply();
  step.backward_weighted({data->get_batch({3, 4, 5, 6})}, {1.0}, {40});
  step.apply();
  step.backward_weighted({data->get_batch({7, 8})}, {1.0}, {20});
  step.apply();
  EXPECT_EQ(step.noise_scale().estimator().measurements(), 1);
}

}  // namespace
}  // namespace batchtune
