#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "batchtune/common/clock.h"

namespace batchtune {

/// One reading of one device. A field the sampler cannot read is empty,
/// never a made-up number; `Sampler::unavailable_reason()` says why.
struct Sample {
  /// When it was read, in seconds of the sampler's `Clock`.
  double time_s = 0;
  /// `cuda:0`, `cpu`, ...
  std::string device;
  /// Share of the sampling period in which the device was busy, 0 to 100.
  /// NVML: time in which any kernel ran. CPU: the process's CPU time over
  /// wall time, as a share of all the cores it may run on.
  std::optional<double> utilization_percent;
  /// GPU memory in use on the device; on CPU the process's resident memory.
  std::optional<int64_t> memory_used_bytes;
  std::optional<double> power_watts;
  /// An energy counter that only grows; its differences are what count.
  std::optional<double> energy_joules;
};

/// Reads utilization, memory, power and energy of one or more devices: NVML
/// for CUDA GPUs, /proc for a process on the CPU, a fake in tests.
class Sampler {
 public:
  virtual ~Sampler() = default;
  /// One `Sample` per device, stamped with the sampler's clock.
  virtual std::vector<Sample> read() = 0;
  /// What is sampled, for people: `NVML (libnvidia-ml.so.1): cuda:0`.
  virtual std::string describe() const = 0;
  /// Why fields are missing, field by field (`energy: ...; power: ...`);
  /// empty when every field is there. Fixed when the sampler is made.
  virtual std::string unavailable_reason() const = 0;
};

/// The NVML library batchtune loads at run time.
constexpr const char* kNvmlLibrary = "libnvidia-ml.so.1";
/// The CPU package's energy counter (Intel RAPL, also on AMD since Zen).
constexpr const char* kRaplEnergyPath = "/sys/class/powercap/intel-rapl:0/energy_uj";

/// A process's CPU utilization and resident memory from `/proc/<pid>/stat`
/// and `/proc/<pid>/statm`, and the CPU package's energy and power from RAPL
/// where it is readable (often root only; it counts the whole package, not
/// just the process).
///
/// Utilization is the process's user + system time between two readings over
/// the wall time between them, as a percentage of all the cores the process
/// may run on (100 = every core busy). The first reading measures from
/// construction.
///
/// Example:
/// ```
///   batchtune::ProcessCpuSampler sampler;  // this process
///   train_for_a_while();
///   auto sample = sampler.read().front();
///   if (sample.utilization_percent) std::cout << *sample.utilization_percent << " %\n";
/// ```
class ProcessCpuSampler final : public Sampler {
 public:
  /// Watches process `pid` (0: this one) in `proc_root`: `/proc`, or in
  /// tests a folder laid out as it (`<pid>/stat`, `<pid>/statm`), read
  /// against a fake `clock`. Throws `batchtune::Error` when there is no such
  /// process.
  explicit ProcessCpuSampler(int pid = 0, Clock& clock = steady_clock(),
                             std::string rapl_energy_path = kRaplEnergyPath,
                             const std::string& proc_root = "/proc");

  std::vector<Sample> read() override;
  std::string describe() const override;
  std::string unavailable_reason() const override { return reason_; }

 private:
  struct Reading {
    double time_s = 0;
    double cpu_s = 0;
    std::optional<double> energy_j;
  };
  Reading take_reading();
  std::optional<double> read_energy_j();

  int pid_;
  std::string proc_dir_;
  Clock& clock_;
  std::string rapl_path_;
  int cores_ = 1;
  std::string reason_;
  Reading last_;
  /// RAPL's counter wraps at max_energy_range_uj; the sampler unwraps it.
  std::optional<double> rapl_raw_j_;
  double rapl_range_j_ = 0;
  double rapl_total_j_ = 0;
};

/// Samples CUDA devices `cuda_indices` through NVML, loaded from `library`
/// with `dlopen` (each CUDA device found in NVML by its PCI bus id, so
/// `CUDA_VISIBLE_DEVICES` is respected). Where NVML cannot be loaded or
/// initialised, returns a sampler whose samples have every field empty and
/// whose reason names the library, the symbol and the error.
std::unique_ptr<Sampler> make_nvml_sampler(const std::vector<int>& cuda_indices,
                                           const std::string& library = kNvmlLibrary);

/// The sampler for `device`: NVML for a CUDA device, this process on the CPU.
std::unique_ptr<Sampler> make_sampler(const c10::Device& device);

/// The sampler for `--device`: `auto` samples every CUDA device where there
/// are any, else this process on the CPU; `cpu`, `cuda`, `cuda:N` as
/// `parse_device`, which throws `batchtune::Error` for the rest.
///
/// Example:
/// ```
///   auto sampler = batchtune::make_sampler("auto");
///   for (const auto& s : sampler->read()) std::cout << s.device << "\n";
///   std::cout << sampler->unavailable_reason() << "\n";
/// ```
std::unique_ptr<Sampler> make_sampler(const std::string& device);

/// Why GPU utilization cannot be sampled here (no CUDA device, no NVML), or
/// empty when it can.
std::string gpu_unavailable_reason();

}  // namespace batchtune
