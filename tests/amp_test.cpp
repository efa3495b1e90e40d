#include "batchtune/step/amp.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include "batchtune/common/error.h"

namespace batchtune {
namespace {

TEST(Amp, GuardTurnsAutocastOnAndRestoresItNested) {
  const at::Tensor a = at::randn({4, 4});
  EXPECT_FALSE(at::autocast::is_autocast_enabled(c10::kCPU));
  {
    AutocastGuard outer(c10::kCPU, AmpMode::kBf16);
    EXPECT_TRUE(at::autocast::is_autocast_enabled(c10::kCPU));
    EXPECT_EQ(at::mm(a, a).scalar_type(), at::kBFloat16);
    {
      AutocastGuard off(c10::kCPU, AmpMode::kOff);  // a no-op
      EXPECT_TRUE(at::autocast::is_autocast_enabled(c10::kCPU));
    }
    EXPECT_TRUE(at::autocast::is_autocast_enabled(c10::kCPU));
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(c10::kCPU));
  EXPECT_EQ(at::mm(a, a).scalar_type(), at::kFloat);
}

TEST(Amp, CpuChoiceFollowsTheMeasurement) {
  EXPECT_EQ(choose_cpu_amp(10.0, 120.0).mode, AmpMode::kOff);  // 12x slower: off
  EXPECT_NE(choose_cpu_amp(10.0, 120.0).reason.find("slower"), std::string::npos);
  EXPECT_EQ(choose_cpu_amp(10.0, 9.5).mode, AmpMode::kOff);    // below the 10 % bar
  EXPECT_EQ(choose_cpu_amp(10.0, 5.0).mode, AmpMode::kBf16);
  EXPECT_EQ(choose_cpu_amp(10.0, std::nullopt).mode, AmpMode::kOff);
}

TEST(Amp, CudaChoiceFollowsComputeCapability) {
  EXPECT_EQ(choose_cuda_amp(9, 0).mode, AmpMode::kBf16);
  EXPECT_EQ(choose_cuda_amp(8, 0).mode, AmpMode::kBf16);
  EXPECT_EQ(choose_cuda_amp(7, 5).mode, AmpMode::kFp16);
  EXPECT_NE(choose_cuda_amp(7, 5).reason.find("loss scaler"), std::string::npos);
}

TEST(Amp, ParsesModesAndNamesTheFlag) {
  EXPECT_EQ(parse_amp("bf16"), AmpMode::kBf16);
  EXPECT_EQ(parse_amp("auto"), AmpMode::kAuto);
  try {
    parse_amp("fp8");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--amp"), std::string::npos);
  }
}

}  // namespace
}  // namespace batchtune
