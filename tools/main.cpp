// batchtune: the library plus main(). Subcommands are one table.
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <iostream>

#include "batchtune/memory/budget_allocator.h"
#include "batchtune/common/error.h"
#include "batchtune/common/interrupt.h"
#include "commands.h"

namespace {

using batchtune::cli::CommandRun;

struct CommandEntry {
  const char* name;
  CommandRun (*add)(CLI::App&);
};

constexpr CommandEntry kCommands[] = {
    {"env", batchtune::cli::add_env_command},
    {"monitor", batchtune::cli::add_monitor_command},
    {"probe", batchtune::cli::add_probe_command},
    {"tune", batchtune::cli::add_tune_command},
    {"plan", batchtune::cli::add_plan_command},
    {"train", batchtune::cli::add_train_command},
    {"launch", batchtune::cli::add_launch_command},
};

constexpr int kExitBadInput = 2;
constexpr int kExitFailure = 1;

}  // namespace

int main(int argc, char** argv) {
  // Before any tensor exists, so that the CPU budget counts every byte.
  batchtune::BudgetAllocator::install();

  CLI::App app("batchtune: find the batch size and training configuration that keep the "
               "accelerator busy and its memory nearly full, never overflowing",
               "batchtune");
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every command");
  std::vector<std::pair<CLI::App*, CommandRun>> commands;
  for (const auto& entry : kCommands) {
    CommandRun run = entry.add(app);
    commands.emplace_back(app.get_subcommand(entry.name), std::move(run));
  }
  if (argc > 1 && argv[1][0] != '-' &&
      std::none_of(std::begin(kCommands), std::end(kCommands),
                   [&](const CommandEntry& c) { return std::string(argv[1]) == c.name; })) {
    std::cerr << "batchtune: unknown command '" << argv[1] << "'; see batchtune --help\n";
    return kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "batchtune: " << e.what() << "; see batchtune --help\n";
    return kExitBadInput;
  }
  try {
    for (auto& [cmd, run] : commands) {
      if (cmd->parsed()) return run();
    }
  } catch (const batchtune::Interrupted&) {
    std::cerr << "batchtune: stopped by " << batchtune::interrupt_name() << "\n";
    return batchtune::interrupt_exit_code();
  } catch (const batchtune::Error& e) {
    std::cerr << "batchtune: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const c10::Error& e) {
    std::cerr << "batchtune: LibTorch error: " << batchtune::first_line(e.what_without_backtrace()) << "\n";
    return kExitFailure;
  } catch (const std::exception& e) {
    std::cerr << "batchtune: " << batchtune::first_line(e.what()) << "\n";
    return kExitFailure;
  }
  return kExitFailure;
}
