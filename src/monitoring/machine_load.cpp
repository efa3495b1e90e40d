#include "batchtune/monitoring/machine_load.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

namespace batchtune {
namespace {

/// Other processes' share below a tenth of a core is the kernel and the
/// monitor's own sampling, not load worth naming.
constexpr double kOtherCoresWorthNaming = 0.1;
constexpr double kStealWorthNaming = 0.02;

double seconds(const timeval& t) {
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
}

}  // namespace

CpuTimes read_cpu_times() {
  CpuTimes t;
  std::ifstream stat("/proc/stat");
  std::string line;
  if (!stat || !std::getline(stat, line) || line.rfind("cpu ", 0) != 0) return t;
  std::istringstream fields(line.substr(4));
  // user nice system idle iowait irq softirq steal (guest time is in user).
  std::vector<double> ticks;
  double value = 0;
  while (ticks.size() < 8 && fields >> value) ticks.push_back(value);
  if (ticks.size() < 8) return t;
  const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
  if (!(hz > 0)) return t;
  const double idle = ticks[3] + ticks[4];
  const double steal = ticks[7];
  double total = 0;
  for (double v : ticks) total += v;
  t.total_s = total / hz;
  t.steal_s = steal / hz;
  t.busy_s = (total - idle - steal) / hz;
  int cores = 0;
  while (std::getline(stat, line) && line.rfind("cpu", 0) == 0) ++cores;
  t.cores = cores;
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return t;
  t.own_s = seconds(usage.ru_utime) + seconds(usage.ru_stime);
  t.valid = cores > 0;
  return t;
}

std::string machine_load_cause(const CpuTimes& before, const CpuTimes& after) {
  if (!before.valid || !after.valid) return "";
  const double total = after.total_s - before.total_s;
  if (!(total > 0)) return "";
  const double wall = total / after.cores;  // seconds of the interval
  const double others = (after.busy_s - before.busy_s) - (after.own_s - before.own_s);
  const double other_cores = others / wall;
  const double steal = (after.steal_s - before.steal_s) / total;
  std::string cause;
  if (other_cores > kOtherCoresWorthNaming) {
    cause = fmt::format("other processes used {:.1f} of {} cores", other_cores, after.cores);
  }
  if (steal > kStealWorthNaming) {
    if (!cause.empty()) cause += "; ";
    cause += fmt::format("CPU steal {:.0f} %", 100 * steal);
  }
  return cause;
}

}  // namespace batchtune
