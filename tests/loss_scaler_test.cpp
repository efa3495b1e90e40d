#include "batchtune/step/loss_scaler.h"

#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <limits>

namespace batchtune {
namespace {

struct OneParameter {
  at::Tensor weight = at::ones({3}).requires_grad_(true);
  torch::optim::SGD optimizer{std::vector<at::Tensor>{weight}, torch::optim::SGDOptions(1.0)};

  void set_grad(std::vector<float> values) {
    weight.mutable_grad() = at::tensor(values);
  }
};

TEST(LossScaler, ScalesTheLossAndUnscalesGradientsBeforeTheStep) {
  LossScaler scaler(LossScalerOptions().init_scale(8.0));
  EXPECT_DOUBLE_EQ(scaler.scale(at::tensor(2.0F)).item<double>(), 16.0);
  OneParameter p;
  p.set_grad({8.0F, 16.0F, -8.0F});  // the scaled gradient of {1, 2, -1}
  EXPECT_TRUE(scaler.step(p.optimizer));
  EXPECT_TRUE(at::allclose(p.weight, at::tensor({0.0F, -1.0F, 2.0F})));
  scaler.update();
  EXPECT_EQ(scaler.growth_tracker(), 1);
  EXPECT_EQ(scaler.skipped_steps(), 0);
}

TEST(LossScaler, SkipsTheStepAndBacksOffOnInfinityOrNan) {
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    LossScaler scaler(LossScalerOptions().init_scale(1024.0));
    OneParameter p;
    p.set_grad({1.0F, bad, 1.0F});
    EXPECT_FALSE(scaler.step(p.optimizer));
    EXPECT_TRUE(at::equal(p.weight, at::ones({3})));  // untouched
    scaler.update();
    EXPECT_DOUBLE_EQ(scaler.current_scale(), 1024.0 * kDefaultBackoffFactor);
    EXPECT_EQ(scaler.growth_tracker(), 0);
    EXPECT_EQ(scaler.skipped_steps(), 1);
  }
}

TEST(LossScaler, GrowsAfterTheIntervalOfFiniteStepsAndResetsOnOverflow) {
  LossScaler scaler(LossScalerOptions().init_scale(4.0).growth_interval(3));
  OneParameter p;
  const auto finite_step = [&] {
    p.set_grad({1.0F, 1.0F, 1.0F});
    EXPECT_TRUE(scaler.step(p.optimizer));
    scaler.update();
  };
  finite_step();
  finite_step();
  EXPECT_DOUBLE_EQ(scaler.current_scale(), 4.0);
  EXPECT_EQ(scaler.growth_tracker(), 2);
  finite_step();
  EXPECT_DOUBLE_EQ(scaler.current_scale(), 4.0 * kDefaultGrowthFactor);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  finite_step();
  finite_step();
  p.set_grad({std::numeric_limits<float>::infinity(), 0.0F, 0.0F});
  EXPECT_FALSE(scaler.step(p.optimizer));
  scaler.update();  // overflow: back off and start counting again
  EXPECT_DOUBLE_EQ(scaler.current_scale(), 4.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  finite_step();
  finite_step();
  EXPECT_DOUBLE_EQ(scaler.current_scale(), 4.0);
}

TEST(LossScaler, DisabledIsAPassThrough) {
  LossScaler scaler(LossScalerOptions().enabled(false));
  EXPECT_DOUBLE_EQ(scaler.scale(at::tensor(3.0F)).item<double>(), 3.0);
  OneParameter p;
  p.set_grad({1.0F, 1.0F, 1.0F});
  EXPECT_TRUE(scaler.step(p.optimizer));
  EXPECT_TRUE(at::allclose(p.weight, at::zeros({3})));
  scaler.update();
  EXPECT_DOUBLE_EQ(scaler.current_scale(), 1.0);
}

TEST(LossScaler, StateRoundTripsForCheckpoints) {
  LossScaler a(LossScalerOptions().init_scale(64.0).growth_interval(5));
  OneParameter p;
  p.set_grad({1.0F, 1.0F, 1.0F});
  a.step(p.optimizer);
  a.update();
  LossScaler b(LossScalerOptions().growth_interval(5));
  b.load_state(a.state());
  EXPECT_DOUBLE_EQ(b.current_scale(), 64.0);
  EXPECT_EQ(b.growth_tracker(), 1);
}

TEST(LossScaler, FusedKernelsAgreeWithTheFallback_CUDA) {
  for (const c10::Device device : {c10::Device(c10::kCPU), c10::Device(c10::kCUDA, 0)}) {
    LossScaler scaler(LossScalerOptions().init_scale(2.0).growth_interval(1), device);
    std::vector<at::Tensor> grads{at::full({4}, 4.0, at::TensorOptions().device(device))};
    EXPECT_TRUE(scaler.unscale(grads));
    EXPECT_TRUE(at::allclose(grads[0].cpu(), at::full({4}, 2.0)));
    scaler.update();
    EXPECT_DOUBLE_EQ(scaler.current_scale(), 4.0) << device;
    grads[0][1] = std::numeric_limits<float>::infinity();
    EXPECT_FALSE(scaler.unscale(grads));
    scaler.update();
    EXPECT_DOUBLE_EQ(scaler.current_scale(), 2.0) << device;
  }
}

}  // namespace
}  // namespace batchtune
