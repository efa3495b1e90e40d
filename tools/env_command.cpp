#include <iostream>

#include "batchtune/reports/console_reporter.h"
#include "batchtune/monitoring/environment.h"
#include "batchtune/reports/json_reporter.h"
#include "commands.h"

namespace batchtune::cli {

CommandRun add_env_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("env", "report LibTorch, CUDA devices, NVML, CPU and RAM");
  auto json = std::make_shared<bool>(false);
  auto threads = std::make_shared<int>(0);
  cmd->add_flag("--json", *json, "print JSON instead of text");
  cmd->add_option("--threads", *threads, "LibTorch CPU threads to set (default: all cores)");
  return [json, threads] {
    configure_threads(*threads);
    const Environment env = collect_environment();
    if (*json) {
      std::cout << to_json(env).dump(2) << std::endl;
    } else {
      print_environment(std::cout, env);
    }
    return 0;
  };
}

}  // namespace batchtune::cli
