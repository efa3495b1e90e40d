#pragma once

#include <string>

namespace batchtune {

/// CPU time of the whole machine and of this process, read at one moment.
/// Two readings around a measurement tell how much of the machine other
/// processes took meanwhile, the likely cause of a noisy timing.
struct CpuTimes {
  bool valid = false;  ///< false where /proc/stat could not be read
  int cores = 0;
  double busy_s = 0;   ///< every core's non-idle time, steal excluded
  double steal_s = 0;  ///< time a hypervisor gave to other guests
  double total_s = 0;  ///< every core's time, idle included
  double own_s = 0;    ///< this process's user + system time
};

/// Now (Linux: /proc/stat and getrusage; elsewhere `valid == false`).
CpuTimes read_cpu_times();

/// What took the machine between `before` and `after` besides this
/// process: "other processes used 0.9 of 2 cores", "CPU steal 6 %", both
/// joined by "; ", or empty when neither passes a tenth of a core (or 2 %
/// steal) or the readings are not valid.
std::string machine_load_cause(const CpuTimes& before, const CpuTimes& after);

}  // namespace batchtune
