#pragma once

// The CLI's subcommands. Each `add_*_command` declares its flags on `app` and
// returns what runs once the command line has been parsed; main.cpp holds the
// table of them.

#include <CLI/CLI.hpp>

#include <functional>

namespace batchtune::cli {

using CommandRun = std::function<int()>;

CommandRun add_env_command(CLI::App& app);
CommandRun add_monitor_command(CLI::App& app);
CommandRun add_probe_command(CLI::App& app);
CommandRun add_estimate_command(CLI::App& app);
CommandRun add_tune_command(CLI::App& app);
CommandRun add_plan_command(CLI::App& app);
CommandRun add_train_command(CLI::App& app);
CommandRun add_launch_command(CLI::App& app);

}  // namespace batchtune::cli
