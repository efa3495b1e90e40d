#include "batchtune/step/amp.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"

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

TEST(Amp, NoRoundMeasuredSaysSoAndPrintsNoSpeedOfNothing) {
  // A starved precision phase printed "ran 0.00x ... median of 0 interleaved rounds".
  const AmpChoice none = choose_cpu_amp({}, 16);
  EXPECT_EQ(none.mode, AmpMode::kOff);
  EXPECT_FALSE(none.confidence.has_value());
  EXPECT_EQ(none.reason.find("0.00x"), std::string::npos) << none.reason;
  EXPECT_EQ(none.reason.find("median of 0"), std::string::npos) << none.reason;
  EXPECT_NE(none.reason.find("not measured"), std::string::npos) << none.reason;
}

TEST(Amp, CpuChoiceDecidesOnlyAtTheStatedConfidence) {
  // 12x slower in every one of six rounds: off, at 96.9 % ([min, max] of six).
  const AmpChoice slow = choose_cpu_amp(std::vector<double>(6, 1.0 / 12), 32);
  EXPECT_EQ(slow.mode, AmpMode::kOff);
  ASSERT_TRUE(slow.confidence.has_value());
  EXPECT_NEAR(*slow.confidence, 1 - 2.0 / 64, 1e-9);
  EXPECT_NE(slow.reason.find("0.08x"), std::string::npos) << slow.reason;
  // 2x faster every round: bf16.
  const AmpChoice fast = choose_cpu_amp({2.0, 2.1, 1.9, 2.0, 2.2, 1.95}, 32);
  EXPECT_EQ(fast.mode, AmpMode::kBf16);
  EXPECT_TRUE(fast.confidence.has_value());
  EXPECT_NE(fast.reason.find("amp bf16"), std::string::npos) << fast.reason;
  // Five rounds cannot reach 95 % even when they agree: inconclusive, fp32 kept.
  const AmpChoice few = choose_cpu_amp({2.0, 2.1, 1.9, 2.0, 2.2}, 32);
  EXPECT_EQ(few.mode, AmpMode::kOff);
  EXPECT_FALSE(few.confidence.has_value());
  EXPECT_NE(few.reason.find("inconclusive, kept fp32"), std::string::npos) << few.reason;
  // Rounds on both sides of the 1.10x bar: inconclusive.
  const AmpChoice mixed = choose_cpu_amp({0.9, 1.3, 1.0, 1.2, 1.05, 1.4, 0.95}, 32);
  EXPECT_EQ(mixed.mode, AmpMode::kOff);
  EXPECT_FALSE(mixed.confidence.has_value());
  // Faster, but not by the 10 % bar, in every round: off, and it says faster.
  const AmpChoice marginal = choose_cpu_amp(std::vector<double>(8, 1.04), 16);
  EXPECT_EQ(marginal.mode, AmpMode::kOff);
  EXPECT_TRUE(marginal.confidence.has_value());
  EXPECT_NE(marginal.reason.find("1.04x"), std::string::npos) << marginal.reason;
  EXPECT_EQ(marginal.reason.find("slower"), std::string::npos) << marginal.reason;
  // bf16 that did not fit where fp32 did.
  EXPECT_EQ(choose_cpu_amp({}, 8, /*bf16_fits=*/false).mode, AmpMode::kOff);
}

TEST(Amp, CudaChoiceFollowsComputeCapability) {
  EXPECT_EQ(choose_cuda_amp(9, 0).mode, AmpMode::kBf16);
  EXPECT_EQ(choose_cuda_amp(8, 0).mode, AmpMode::kBf16);
  EXPECT_EQ(choose_cuda_amp(7, 5).mode, AmpMode::kFp16);
  EXPECT_NE(choose_cuda_amp(7, 5).reason.find("loss scaler"), std::string::npos);
}

TEST(Amp, Fp16IsRefusedOffCudaNamingWhereItCameFrom) {
  EXPECT_NO_THROW(check_amp_device(AmpMode::kBf16, c10::Device(c10::kCPU), "--amp"));
  EXPECT_NO_THROW(check_amp_device(AmpMode::kOff, c10::Device(c10::kCPU), "--amp"));
  EXPECT_NO_THROW(check_amp_device(AmpMode::kFp16, c10::Device(c10::kCUDA, 0), "--amp"));
  try {
    check_amp_device(AmpMode::kFp16, c10::Device(c10::kCPU), "a plan's \"amp\"");
    FAIL() << "fp16 on the CPU was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("a plan's \"amp\": fp16", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("runs on cpu"), std::string::npos) << e.what();
  }
}

TEST(Amp, ParsesModesAndNamesTheOption) {
  EXPECT_EQ(parse_amp("bf16"), AmpMode::kBf16);
  EXPECT_EQ(parse_amp("auto"), AmpMode::kAuto);
  try {
    parse_amp("fp8");
    FAIL();
  } catch (const OptionError& e) {
    EXPECT_EQ(e.option(), Option::kAmp);
    EXPECT_STREQ(e.what(), "--amp: unknown mixed precision 'fp8'; use off, bf16, fp16 or auto");
    EXPECT_EQ(e.message(FrontEnd::kPython),
              "amp: unknown mixed precision 'fp8'; use off, bf16, fp16 or auto");
  }
  // A value that no option gave names where it came from.
  try {
    parse_amp("fp8", "the checkpoint");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("the checkpoint: unknown mixed precision", 0), 0u);
  }
}

}  // namespace
}  // namespace batchtune
