#include "batchtune/monitoring/environment.h"

#include <ATen/Parallel.h>
#include <sched.h>
#include <torch/version.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "memory/cuda_support.h"
#include "common/shared_library.h"

namespace batchtune {
namespace {

constexpr const char* kNvmlLibrary = "libnvidia-ml.so.1";

int64_t meminfo_bytes(const std::string& key) {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream fields(line.substr(key.size() + 1));
      int64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

}  // namespace

int64_t ram_total_bytes() { return meminfo_bytes("MemTotal"); }
int64_t ram_available_bytes() { return meminfo_bytes("MemAvailable"); }

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int configure_threads(int threads) {
  const int count = threads > 0 ? threads : available_cores();
  at::set_num_threads(count);
  return at::get_num_threads();
}

Environment collect_environment() {
  Environment env;
  env.torch_version = TORCH_VERSION;
  env.torch_cuda = cuda::compiled();
  env.gpus = cuda::devices(&env.cuda_reason);
  env.cuda_available = !env.gpus.empty();
  if (env.cuda_available) env.cuda_reason.clear();
  env.cuda_driver = cuda::driver_version();
  env.nvml_available = SharedLibrary::can_open(kNvmlLibrary, &env.nvml_reason);
  env.cpu_model = cpu_model();
  env.cpu_cores = available_cores();
  env.threads = at::get_num_threads();
  env.ram_total_bytes = ram_total_bytes();
  env.ram_available_bytes = ram_available_bytes();
  return env;
}

}  // namespace batchtune
