#include "batchtune/step/training_step.h"
#include "batchtune/step/workload.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "batchtune/common/error.h"

namespace {

using namespace batchtune;

TEST(Models, EveryBuiltinModelTrainsOneStep) {
  for (const auto& name : builtin_model_names()) {
    if (name == "gpt") continue;  // token input: gpt_test.cpp
    Workload workload(WorkloadOptions().model(name).input_shape({3, 32, 32}).classes(5));
    const Batch batch = workload.synthetic_batch(4);
    const auto out = workload.model().forward(batch.input());
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{4, 5})) << name;
    const auto before = workload.model().parameters().front().clone();
    const double loss = TrainingStep(workload, c10::Device(c10::kCPU)).run(batch).item<double>();
    EXPECT_TRUE(std::isfinite(loss)) << name;
    EXPECT_FALSE(torch::equal(before, workload.model().parameters().front())) << name;
  }
}

TEST(Models, ConvnetIsTheGuidesNetwork) {
  Workload workload(WorkloadOptions().model("convnet").input_shape({3, 64, 64}));
  // Conv2d(3->64, k=3): 64*3*3*3 + 64; Linear(64->10): 640 + 10.
  EXPECT_EQ(parameter_count(workload.model()), 64 * 27 + 64 + 640 + 10);
}

TEST(Models, Resnet18HasTheStandardSize) {
  Workload workload(WorkloadOptions().model("resnet18").classes(1000));
  EXPECT_EQ(parameter_count(workload.model()), 11689512);  // torchvision's resnet18
}

TEST(Models, LenetOnFashionMnistShape) {
  Workload workload(WorkloadOptions().model("lenet").input_shape({1, 28, 28}));
  EXPECT_EQ(workload.model().forward(workload.synthetic_batch(2).input()).size(1), 10);
}

TEST(Workload, BadChoicesAreUserErrors) {
  EXPECT_THROW(Workload(WorkloadOptions().model("vgg")), Error);
  EXPECT_THROW(Workload(WorkloadOptions().optimizer("lbfgs")), Error);
  EXPECT_THROW(Workload(WorkloadOptions().lr(0)), Error);
  EXPECT_THROW(Workload(WorkloadOptions().model("lenet").input_shape({1, 6, 6})), Error);
  EXPECT_THROW(Workload(WorkloadOptions().model("convnet").input_shape({784})), Error);
  EXPECT_THROW(Workload(WorkloadOptions().classes(1)), Error);
}

TEST(Workload, RegressionTargetsTrainWithMse) {
  InputSpec spec = parse_input_flags(InputFlags().inputs({"16"}).target("float:3"));
  Workload workload(WorkloadOptions().model("mlp").input_spec(spec).seed(2).lr(1e-2));
  const Batch batch = workload.synthetic_batch(8);
  EXPECT_EQ(batch.target.sizes(), (std::vector<int64_t>{8, 3}));
  EXPECT_EQ(batch.target.scalar_type(), at::kFloat);
  const double first = TrainingStep(workload, c10::Device(c10::kCPU)).run(batch).item<double>();
  double last = first;
  for (int i = 0; i < 30; ++i) last = TrainingStep(workload, c10::Device(c10::kCPU)).run(batch).item<double>();
  EXPECT_LT(last, 0.5 * first) << first << " -> " << last;
}

TEST(Workload, SyntheticBatchesAreSeeded) {
  Workload a(WorkloadOptions().seed(3));
  Workload b(WorkloadOptions().seed(3));
  EXPECT_TRUE(torch::equal(a.synthetic_batch(4).input(), b.synthetic_batch(4).input()));
  EXPECT_TRUE(torch::equal(a.synthetic_batch(4).target, b.synthetic_batch(4).target));
  Workload c(WorkloadOptions().seed(4));
  EXPECT_FALSE(torch::equal(a.synthetic_batch(4).input(), c.synthetic_batch(4).input()));
  const auto target = a.synthetic_batch(64).target;
  EXPECT_GE(target.min().item<int64_t>(), 0);
  EXPECT_LT(target.max().item<int64_t>(), 10);
}

}  // namespace

namespace {

TEST(Models, CountTheirForwardFlops) {
  using namespace batchtune;
  // convnet on 3x64x64: conv 2*3*9*64*62*62 + linear 2*64*10.
  Workload convnet(WorkloadOptions().model("convnet").input_shape({3, 64, 64}));
  EXPECT_DOUBLE_EQ(*convnet.model().forward_flops_per_sample(), 2.0 * 3 * 9 * 64 * 62 * 62 + 1280);
  Workload mlp(WorkloadOptions().model("mlp").input_shape({1, 28, 28}));
  EXPECT_DOUBLE_EQ(*mlp.model().forward_flops_per_sample(), 2.0 * (784 * 256 + 256 * 10));
  // ResNet-18 at 224x224 is the well-known 1.82 GMAC.
  Workload resnet(WorkloadOptions().model("resnet18").input_shape({3, 224, 224}).classes(1000));
  EXPECT_NEAR(*resnet.model().forward_flops_per_sample() / 2, 1.82e9, 0.01e9);
}

}  // namespace
