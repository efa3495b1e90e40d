#include "batchtune/monitoring/sampler.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <vector>

#include "batchtune/monitoring/environment.h"
#include "batchtune/common/error.h"
#include "fake_clock.h"
#include "common/shared_library.h"
#include "monitoring/nvml_memory.h"

namespace {

using batchtune::ProcessCpuSampler;
using batchtune::testing::FakeClock;

/// /proc counts CPU time in ticks of 10 ms.
constexpr double kTickS = 0.01;

double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int64_t clock_ticks_per_s() { return sysconf(_SC_CLK_TCK); }

int affinity_cores() {
  cpu_set_t set;
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  return CPU_COUNT(&set);
}

/// A folder laid out as /proc for this process: `<pid>/stat` (with a
/// command name holding ") " and spaces) and `<pid>/statm`.
class FakeProc {
 public:
  FakeProc() {
    char dir_template[] = "/tmp/batchtune-proc-XXXXXX";
    EXPECT_NE(mkdtemp(dir_template), nullptr);
    root_ = dir_template;
    pid_dir_ = root_ + "/" + std::to_string(getpid());
    EXPECT_EQ(mkdir(pid_dir_.c_str(), 0700), 0);
  }
  ~FakeProc() {
    std::remove((pid_dir_ + "/stat").c_str());
    std::remove((pid_dir_ + "/statm").c_str());
    rmdir(pid_dir_.c_str());
    rmdir(root_.c_str());
  }
  /// CPU time used so far, in clock ticks; resident memory in pages.
  void set(int64_t utime_ticks, int64_t stime_ticks, int64_t resident_pages) {
    std::ofstream(pid_dir_ + "/stat")
        << getpid() << " (a b) c) S 1 1 1 0 -1 4194304 0 0 0 0 " << utime_ticks << " "
        << stime_ticks << " 0 0 20 0 1 0 0 0 0\n";
    std::ofstream(pid_dir_ + "/statm") << resident_pages * 4 << " " << resident_pages
                                        << " 0 0 0 0 0\n";
  }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
  std::string pid_dir_;
};

TEST(ProcessCpuSampler, UtilizationIsCpuTimeOverClockTimeOnEveryCore) {
  FakeProc proc;
  FakeClock clock(20);
  const int64_t ticks = clock_ticks_per_s();
  const int64_t cores = affinity_cores();
  proc.set(100, 50, 1000);
  ProcessCpuSampler sampler(0, clock, "/nonexistent/energy_uj", proc.root());

  // 4 s of the clock; 1 s of user and 1 s of system time on each core: 50 %.
  clock.advance(4);
  proc.set(100 + cores * ticks, 50 + cores * ticks, 1000);
  const auto half = sampler.read().at(0);
  EXPECT_EQ(half.device, "cpu");
  EXPECT_DOUBLE_EQ(half.time_s, 24);
  ASSERT_TRUE(half.utilization_percent.has_value());
  EXPECT_DOUBLE_EQ(*half.utilization_percent, 50.0);
  EXPECT_EQ(half.memory_used_bytes, 1000 * static_cast<int64_t>(sysconf(_SC_PAGESIZE)));

  // 3 s of CPU time per core in 1 s (ticks counted late): read as 100 %.
  clock.advance(1);
  proc.set(100 + 4 * cores * ticks, 50 + cores * ticks, 2000);
  const auto over = sampler.read().at(0);
  EXPECT_DOUBLE_EQ(*over.utilization_percent, 100.0);
  EXPECT_EQ(over.memory_used_bytes, 2000 * static_cast<int64_t>(sysconf(_SC_PAGESIZE)));

  // Nothing used in 2 s: 0 %.
  clock.advance(2);
  EXPECT_DOUBLE_EQ(*sampler.read().at(0).utilization_percent, 0.0);

  // Below a millisecond between readings a share would be noise: none.
  clock.advance(0.0005);
  proc.set(100 + 5 * cores * ticks, 50 + cores * ticks, 2000);
  EXPECT_FALSE(sampler.read().at(0).utilization_percent.has_value());
  EXPECT_NE(sampler.describe().find(proc.root()), std::string::npos) << sampler.describe();
}

TEST(ProcessCpuSampler, ReadsThisProcessAsTheKernelCountsIt) {
  FakeClock clock;
  ProcessCpuSampler sampler(0, clock);
  const double cpu0 = process_cpu_s();
  // Busy for 0.2 s of this process's CPU time (not of the wall clock).
  volatile double x = 0;
  while (process_cpu_s() - cpu0 < 0.2) {
    for (int i = 0; i < 1000; ++i) x = x + i * 0.5;
  }
  const double cpu1 = process_cpu_s();
  clock.advance(1);
  const auto busy = sampler.read().at(0);
  ASSERT_TRUE(busy.utilization_percent.has_value());
  // What the kernel's own clock says this process used in that 1 s of the
  // fake clock, within /proc's ticks: the sampler's reading began before
  // cpu0 and ended after cpu1.
  const int cores = affinity_cores();
  const double expected = 100.0 * (cpu1 - cpu0) / cores;
  EXPECT_NEAR(*busy.utilization_percent, expected, 100.0 * 3 * kTickS / cores);
  ASSERT_TRUE(busy.memory_used_bytes.has_value());
  EXPECT_GT(*busy.memory_used_bytes, 0);
}

TEST(ProcessCpuSampler, MemoryIsTheResidentSetAndGrowsWithTouchedPages) {
  ProcessCpuSampler sampler;
  const auto before = sampler.read().at(0);
  ASSERT_TRUE(before.memory_used_bytes.has_value());
  constexpr size_t kBytes = 64 << 20;
  std::vector<char> block(kBytes, 1);
  const auto after = sampler.read().at(0);
  EXPECT_GE(*after.memory_used_bytes - *before.memory_used_bytes,
            static_cast<int64_t>(kBytes * 9 / 10));
  EXPECT_EQ(block[kBytes / 2], 1);
}

TEST(ProcessCpuSampler, NoEnergyCounterGivesTheReasonNotANumber) {
  ProcessCpuSampler sampler(0, batchtune::steady_clock(), "/nonexistent/intel-rapl:0/energy_uj");
  const auto sample = sampler.read().at(0);
  EXPECT_FALSE(sample.energy_joules.has_value());
  EXPECT_FALSE(sample.power_watts.has_value());
  EXPECT_NE(sampler.unavailable_reason().find("/nonexistent/intel-rapl:0/energy_uj"),
            std::string::npos)
      << sampler.unavailable_reason();
}

TEST(ProcessCpuSampler, EnergyCounterIsUnwrappedAndGivesPower) {
  // POSIX, not std::filesystem: the torch wheel's libtorch.so exports its own
  // std::filesystem symbols, and its remove_all crashed here.
  char dir_template[] = "/tmp/batchtune-rapl-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string energy = dir + "/energy_uj";
  const std::string range = dir + "/max_energy_range_uj";
  auto write = [](const std::string& path, const char* text) {
    std::ofstream(path) << text << "\n";
  };
  write(range, "10000000");  // wraps at 10 J
  write(energy, "1000000");
  FakeClock clock(50);
  ProcessCpuSampler sampler(0, clock, energy);
  EXPECT_EQ(sampler.unavailable_reason(), "");

  clock.advance(1.0);
  write(energy, "9000000");
  const auto first = sampler.read().at(0);
  EXPECT_DOUBLE_EQ(*first.energy_joules, 8.0);
  EXPECT_DOUBLE_EQ(*first.power_watts, 8.0);

  clock.advance(0.5);
  write(energy, "2000000");  // wrapped: 9 J -> 10 J -> 0 -> 2 J
  const auto second = sampler.read().at(0);
  EXPECT_DOUBLE_EQ(*second.energy_joules, 11.0);
  EXPECT_DOUBLE_EQ(*second.power_watts, 6.0);
  unlink(energy.c_str());
  unlink(range.c_str());
  rmdir(dir.c_str());
}

TEST(ProcessCpuSampler, NoSuchProcessIsAnErrorNamingIt) {
  try {
    ProcessCpuSampler sampler(2147483647);
    FAIL() << "no process has that id";
  } catch (const batchtune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("process 2147483647: no such process"), std::string::npos) << e.what();
  }
}

TEST(NvmlSampler, AbsentLibraryGivesItsNameAsTheReasonAndNoNumbers) {
  if (batchtune::SharedLibrary::can_open(batchtune::kNvmlLibrary, nullptr)) {
    GTEST_SKIP() << "NVML is installed here";
  }
  auto sampler = batchtune::make_nvml_sampler({0});
  EXPECT_NE(sampler->unavailable_reason().find("libnvidia-ml.so.1"), std::string::npos)
      << sampler->unavailable_reason();
  const auto samples = sampler->read();
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].device, "cuda:0");
  EXPECT_FALSE(samples[0].utilization_percent.has_value());
  EXPECT_FALSE(samples[0].memory_used_bytes.has_value());
  EXPECT_FALSE(samples[0].power_watts.has_value());
  EXPECT_FALSE(samples[0].energy_joules.has_value());
}

TEST(NvmlSampler, LibraryWithoutTheSymbolNamesLibraryAndSymbol) {
  auto sampler = batchtune::make_nvml_sampler({0}, "libc.so.6");
  const std::string reason = sampler->unavailable_reason();
  EXPECT_NE(reason.find("libc.so.6"), std::string::npos) << reason;
  EXPECT_NE(reason.find("nvmlInit_v2"), std::string::npos) << reason;
}

TEST(MakeSampler, CpuWatchesThisProcess) {
  auto sampler = batchtune::make_sampler("cpu");
  EXPECT_NE(sampler->describe().find(std::to_string(::getpid())), std::string::npos)
      << sampler->describe();
  EXPECT_EQ(sampler->read().at(0).device, "cpu");
}

TEST(MakeSampler, AutoWithoutAGpuIsTheCpuAndSaysWhy) {
  if (batchtune::gpu_unavailable_reason().empty()) GTEST_SKIP() << "a GPU and NVML are here";
  const std::string reason = batchtune::gpu_unavailable_reason();
  EXPECT_FALSE(reason.empty());
  auto sampler = batchtune::make_sampler("auto");
  const auto samples = sampler->read();
  ASSERT_FALSE(samples.empty());
  if (samples[0].device == "cpu") {
    EXPECT_NE(reason.find("CUDA"), std::string::npos) << reason;
  }
}

TEST(MakeSampler, UnknownDeviceIsAnErrorNamingTheFlag) {
  try {
    batchtune::make_sampler("gpu");
    FAIL();
  } catch (const batchtune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--device"), std::string::npos) << e.what();
  }
}

TEST(MakeSampler, ReadsTheGpu_CUDA) {
  auto sampler = batchtune::make_sampler("cuda");
  const auto sample = sampler->read().at(0);
  EXPECT_EQ(sample.device, "cuda:0");
  if (!batchtune::SharedLibrary::can_open(batchtune::kNvmlLibrary, nullptr)) {
    GTEST_SKIP() << "no NVML: " << sampler->unavailable_reason();
  }
  ASSERT_TRUE(sample.utilization_percent.has_value()) << sampler->unavailable_reason();
  EXPECT_GE(*sample.utilization_percent, 0);
  EXPECT_LE(*sample.utilization_percent, 100);
  ASSERT_TRUE(sample.memory_used_bytes.has_value());
  EXPECT_GT(*sample.memory_used_bytes, 0);
}

}  // namespace

namespace batchtune {
namespace {

constexpr unsigned long long kGiB = 1ULL << 30;

// What a driver from R510 answers: version 2 without the driver's reserved
// memory in `used`, version 1 with it.
nvml::Return v2_answers(nvml::Device, nvml::MemoryV2* memory) {
  if (memory->version != nvml::kMemoryV2Version) return nvml::kErrorArgumentVersionMismatch;
  memory->total = 141 * kGiB;
  memory->reserved = kGiB / 2;
  memory->used = 10 * kGiB;
  memory->free = memory->total - memory->reserved - memory->used;
  return nvml::kSuccess;
}
nvml::Return v2_refuses(nvml::Device, nvml::MemoryV2*) {
  return nvml::kErrorArgumentVersionMismatch;
}
nvml::Return v2_fails(nvml::Device, nvml::MemoryV2*) { return 999; }
nvml::Return v1_answers(nvml::Device, nvml::Memory* memory) {
  memory->total = 141 * kGiB;
  memory->used = 10 * kGiB + kGiB / 2;
  memory->free = memory->total - memory->used;
  return nvml::kSuccess;
}

TEST(NvmlMemory, UsedIsVersion2sWhereTheDriverHasIt) {
  EXPECT_EQ(nvml::kMemoryV2Version, 0x02000028U);  // NVML_STRUCT_VERSION(Memory, 2)
  NvmlMemoryReading r;
  ASSERT_EQ(read_nvml_memory(nullptr, v2_answers, v1_answers, &r), nvml::kSuccess);
  EXPECT_EQ(r.used, static_cast<int64_t>(10 * kGiB));  // as nvidia-smi shows it
  EXPECT_EQ(r.free, static_cast<int64_t>(141 * kGiB - 10 * kGiB - kGiB / 2));
}

TEST(NvmlMemory, FallsBackToVersion1WhereVersion2IsMissingOrRefused) {
  NvmlMemoryReading r;
  ASSERT_EQ(read_nvml_memory(nullptr, nullptr, v1_answers, &r), nvml::kSuccess);
  EXPECT_EQ(r.used, static_cast<int64_t>(10 * kGiB + kGiB / 2));
  NvmlMemoryReading refused;
  ASSERT_EQ(read_nvml_memory(nullptr, v2_refuses, v1_answers, &refused), nvml::kSuccess);
  EXPECT_EQ(refused.used, static_cast<int64_t>(10 * kGiB + kGiB / 2));
  // Another failure is the answer (a lost GPU is not hidden behind v1).
  NvmlMemoryReading failed;
  EXPECT_EQ(read_nvml_memory(nullptr, v2_fails, v1_answers, &failed), 999);
  EXPECT_EQ(failed.used, 0);
}

}  // namespace
}  // namespace batchtune
