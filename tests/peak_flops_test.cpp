// The datasheet peaks that model FLOPs utilization divides by, and the MFU
// of the sweep rows in the JSON, the console and the page.
#include "batchtune/monitoring/peak_flops.h"

#include <gtest/gtest.h>

#include <sstream>
#include <vector>

#include "batchtune/reports/tune_console.h"
#include "batchtune/reports/tune_json.h"
#include "batchtune/reports/tune_report.h"
#include "batchtune/tuning/sweep.h"

namespace {

using namespace batchtune;

TEST(PeakFlops, NamesMatchTheirOwnRowTheMoreSpecificFirst) {
  // As CUDA names the cards.
  EXPECT_DOUBLE_EQ(peak_flops("NVIDIA H200", AmpMode::kBf16, false)->flops_per_s, 989.5e12);
  EXPECT_DOUBLE_EQ(peak_flops("NVIDIA H200 NVL", AmpMode::kBf16, false)->flops_per_s, 835.5e12);
  EXPECT_DOUBLE_EQ(peak_flops("NVIDIA H100 80GB HBM3", AmpMode::kFp16, false)->flops_per_s,
                   989.5e12);
  EXPECT_DOUBLE_EQ(peak_flops("NVIDIA H100 PCIe", AmpMode::kBf16, false)->flops_per_s, 756e12);
  EXPECT_DOUBLE_EQ(peak_flops("NVIDIA L40S", AmpMode::kBf16, false)->flops_per_s, 362e12);
  EXPECT_DOUBLE_EQ(peak_flops("NVIDIA L4", AmpMode::kBf16, false)->flops_per_s, 121e12);
  EXPECT_EQ(peak_flops("NVIDIA L4", AmpMode::kBf16, false)->precision, "bf16");
  EXPECT_FALSE(peak_flops("NVIDIA GeForce GTX 1080", AmpMode::kBf16, false).has_value());
}

TEST(PeakFlops, Fp32IsTheCudaCoresPeakUnlessMatrixProductsMayUseTf32) {
  const auto fp32 = peak_flops("NVIDIA A100-SXM4-80GB", AmpMode::kOff, false);
  ASSERT_TRUE(fp32.has_value());
  EXPECT_DOUBLE_EQ(fp32->flops_per_s, 19.5e12);
  EXPECT_EQ(fp32->precision, "fp32");
  const auto tf32 = peak_flops("NVIDIA A100-SXM4-80GB", AmpMode::kOff, true);
  EXPECT_DOUBLE_EQ(tf32->flops_per_s, 156e12);
  EXPECT_EQ(tf32->precision, "tf32");
  EXPECT_NE(tf32->source.find("A100 datasheet"), std::string::npos);
}

TEST(PeakFlops, TheCpuHasNoPeakAndSaysWhy) {
  std::string why;
  EXPECT_FALSE(device_peak_flops(c10::Device(c10::kCPU), AmpMode::kOff, &why).has_value());
  EXPECT_EQ(why, "no peak for the CPU: model FLOPs utilization is given for GPUs");
}

TEST(PeakFlops, EachRowsMfuIsItsAchievedFlopsOverThePeak) {
  std::vector<SweepRow> rows(2);
  rows[0].samples_per_s = 1000;
  rows[1].samples_per_s = 2500;
  // ResNet-50's forward, ~8.2 GFLOP a sample: 2500 samples/s trains at
  // 3 x 8.2e9 x 2500 = 61.5 TFLOP/s, 6.2 % of an H200's bf16 peak.
  add_flops(rows, 8.2e9, 989.5e12);
  EXPECT_DOUBLE_EQ(*rows[1].flops_per_s, 3 * 8.2e9 * 2500);
  EXPECT_NEAR(*rows[1].mfu, 0.0622, 1e-4);
  EXPECT_NEAR(*rows[0].mfu, 0.0249, 1e-4);
  // No peak: FLOP/s alone.
  std::vector<SweepRow> cpu(1);
  cpu[0].samples_per_s = 10;
  add_flops(cpu, 1e6);
  EXPECT_TRUE(cpu[0].flops_per_s.has_value());
  EXPECT_FALSE(cpu[0].mfu.has_value());
}

TuneResult swept(bool with_peak) {
  TuneResult r;
  r.device = with_peak ? "cuda:0" : "cpu";
  r.capacity_bytes = 1 << 30;
  for (int64_t b : {64, 128}) {
    SweepRow row;
    row.batch_size = b;
    row.samples_per_s = 20.0 * static_cast<double>(b);
    row.step_ms = 50;
    row.busy = 1;
    r.sweep.push_back(row);
  }
  r.selection.batch_size = 128;
  if (with_peak) {
    r.peak_flops = peak_flops("NVIDIA H200", AmpMode::kBf16, false);
    add_flops(r.sweep, 8.2e9, r.peak_flops->flops_per_s);
  } else {
    r.mfu_note = "no peak for the CPU: model FLOPs utilization is given for GPUs";
    add_flops(r.sweep, 8.2e9);
  }
  return r;
}

TEST(PeakFlops, TheReportsGiveEachRowsMfuAndThePeakItDividesBy) {
  const TuneResult gpu = swept(true);
  const nlohmann::json json = to_json(gpu);
  EXPECT_NEAR(json.at("sweep").at(1).at("mfu").get<double>(), 3 * 8.2e9 * 2560 / 989.5e12, 1e-12);
  EXPECT_DOUBLE_EQ(json.at("peak_flops").at("flops_per_s").get<double>(), 989.5e12);
  EXPECT_EQ(json.at("peak_flops").at("precision"), "bf16");
  EXPECT_EQ(json.at("peak_flops").at("gpu"), "NVIDIA H200");
  EXPECT_TRUE(json.at("mfu_note").is_null());
  std::ostringstream console;
  print_sweep(console, gpu);
  EXPECT_NE(console.str().find("62976.0 (6.4% MFU)"), std::string::npos) << console.str();
  EXPECT_NE(console.str().find("MFU: over the bf16 peak 989.5 TFLOP/s of NVIDIA H200"),
            std::string::npos);
  EXPECT_NE(html_report(gpu).find("62976.0 (6.4 % MFU)"), std::string::npos);

  const TuneResult cpu = swept(false);
  const nlohmann::json cpu_json = to_json(cpu);
  EXPECT_TRUE(cpu_json.at("sweep").at(1).at("mfu").is_null());
  EXPECT_TRUE(cpu_json.at("peak_flops").is_null());
  EXPECT_EQ(cpu_json.at("mfu_note"), "no peak for the CPU: model FLOPs utilization is given for GPUs");
  std::ostringstream cpu_console;
  print_sweep(cpu_console, cpu);
  EXPECT_NE(cpu_console.str().find("MFU: n/a (no peak for the CPU"), std::string::npos);
}

}  // namespace
