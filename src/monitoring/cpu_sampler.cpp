#include <fmt/format.h>

#include <algorithm>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "batchtune/monitoring/environment.h"
#include "batchtune/common/error.h"
#include "batchtune/monitoring/sampler.h"

namespace batchtune {
namespace {

/// Below this wall time between readings, a utilization would be noise.
constexpr double kMinUtilizationWindowS = 1e-3;
/// In /proc/<pid>/stat, counting fields after the `)` that ends the command
/// name (which may hold spaces): utime and stime are fields 14 and 15.
constexpr int kUtimeAfterName = 11;

std::string read_first_line(const std::string& path, std::string* error) {
  std::ifstream file(path);
  std::string line;
  if (!file || !std::getline(file, line)) {
    if (error != nullptr) *error = fmt::format("{}: {}", path, std::strerror(errno));
    return {};
  }
  return line;
}

int cores_of(int pid) {
  cpu_set_t set;
  if (sched_getaffinity(pid, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return available_cores();
}

}  // namespace

ProcessCpuSampler::ProcessCpuSampler(int pid, Clock& clock, std::string rapl_energy_path,
                                     const std::string& proc_root)
    : pid_(pid > 0 ? pid : static_cast<int>(getpid())),
      proc_dir_(fmt::format("{}/{}", proc_root, pid_)),
      clock_(clock),
      rapl_path_(std::move(rapl_energy_path)),
      cores_(cores_of(pid_)) {
  std::string error;
  if (read_first_line(proc_dir_ + "/stat", &error).empty()) {
    throw Error(fmt::format("process {}: no such process ({})", pid_, error));
  }
  std::string rapl_error;
  const std::string raw = read_first_line(rapl_path_, &rapl_error);
  if (raw.empty()) {
    reason_ = fmt::format("energy, power: {}", rapl_error);
  } else {
    const std::string range_path =
        rapl_path_.substr(0, rapl_path_.rfind('/') + 1) + "max_energy_range_uj";
    const std::string range = read_first_line(range_path, nullptr);
    rapl_range_j_ = range.empty() ? 0.0 : std::stod(range) * 1e-6;
  }
  last_ = take_reading();
}

std::optional<double> ProcessCpuSampler::read_energy_j() {
  if (!reason_.empty()) return std::nullopt;
  const std::string raw_text = read_first_line(rapl_path_, nullptr);
  if (raw_text.empty()) return std::nullopt;
  const double raw = std::stod(raw_text) * 1e-6;
  if (rapl_raw_j_) {
    double delta = raw - *rapl_raw_j_;
    if (delta < 0) delta += rapl_range_j_;  // the counter wrapped
    rapl_total_j_ += delta;
  }
  rapl_raw_j_ = raw;
  return rapl_total_j_;
}

ProcessCpuSampler::Reading ProcessCpuSampler::take_reading() {
  std::string error;
  const std::string stat = read_first_line(proc_dir_ + "/stat", &error);
  const auto name_end = stat.rfind(')');
  if (stat.empty() || name_end == std::string::npos) {
    throw std::runtime_error(fmt::format("process {} cannot be read any more ({})", pid_,
                                         error.empty() ? "malformed stat" : error));
  }
  std::istringstream fields(stat.substr(name_end + 1));
  std::string skip;
  for (int i = 0; i < kUtimeAfterName; ++i) fields >> skip;
  uint64_t utime = 0;
  uint64_t stime = 0;
  fields >> utime >> stime;
  Reading reading;
  reading.time_s = clock_.now_s();
  reading.cpu_s = static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  reading.energy_j = read_energy_j();
  return reading;
}

std::vector<Sample> ProcessCpuSampler::read() {
  const Reading now = take_reading();
  Sample sample;
  sample.time_s = now.time_s;
  sample.device = "cpu";
  const double wall_s = now.time_s - last_.time_s;
  if (wall_s >= kMinUtilizationWindowS) {
    // CPU time comes in clock ticks (10 ms) and the window is short, so a
    // busy process can read 101-122 %; the documented scale ends at 100 %.
    sample.utilization_percent =
        std::clamp(100.0 * (now.cpu_s - last_.cpu_s) / (wall_s * cores_), 0.0, 100.0);
    if (now.energy_j && last_.energy_j) {
      sample.power_watts = (*now.energy_j - *last_.energy_j) / wall_s;
    }
  }
  sample.energy_joules = now.energy_j;
  std::istringstream statm(read_first_line(proc_dir_ + "/statm", nullptr));
  int64_t size_pages = 0;
  int64_t resident_pages = 0;
  if (statm >> size_pages >> resident_pages) {
    sample.memory_used_bytes = resident_pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  }
  last_ = now;
  return {sample};
}

std::string ProcessCpuSampler::describe() const {
  return fmt::format("process {} on {} CPU core(s) ({}/stat; 100 % = all cores busy)", pid_,
                     cores_, proc_dir_);
}

}  // namespace batchtune
