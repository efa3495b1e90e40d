// batchtune: the library plus main(). Subcommands are one table.
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <torch/version.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "batchtune/common/atomic_file.h"
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
    {"estimate", batchtune::cli::add_estimate_command},
    {"plan", batchtune::cli::add_plan_command},
    {"train", batchtune::cli::add_train_command},
    {"launch", batchtune::cli::add_launch_command},
};

constexpr int kExitBadInput = 2;
constexpr int kExitFailure = 1;

// A flag this many edits from a known one is taken for a typo of it.
constexpr size_t kMaxSuggestionDistance = 3;

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

/// "unknown flag --max-batchs; did you mean --max-batch?" for the first
/// flag of `argv` that `command` does not know, or "" when all are known.
std::string unknown_flag_hint(const CLI::App& command, int argc, char** argv) {
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-' || std::isdigit(static_cast<unsigned char>(arg[1]))) {
      continue;
    }
    const std::string name = arg.substr(0, arg.find('='));
    if (command.get_option_no_throw(name) != nullptr || name == "--help" || name == "-h") {
      continue;
    }
    std::string best;
    size_t best_distance = kMaxSuggestionDistance + 1;
    for (const CLI::Option* option : command.get_options()) {
      for (const std::string& known : option->get_lnames()) {
        const size_t d = edit_distance(name, "--" + known);
        if (d < best_distance) {
          best_distance = d;
          best = "--" + known;
        }
      }
    }
    return best.empty() ? fmt::format("unknown flag {}", name)
                        : fmt::format("unknown flag {} (did you mean {}?)", name, best);
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  batchtune::guard_stdout();  // before anything opens a file
  // Before any tensor exists, so that the CPU budget counts every byte.
  batchtune::BudgetAllocator::install();

  CLI::App app("batchtune: find the batch size and training configuration that keep the "
               "accelerator busy and its memory nearly full, never overflowing",
               "batchtune");
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every command");
  app.set_version_flag("--version", fmt::format("batchtune {} (LibTorch {})", BATCHTUNE_VERSION,
                                                TORCH_VERSION));
  std::vector<std::pair<CLI::App*, CommandRun>> commands;
  for (const auto& entry : kCommands) {
    CommandRun run = entry.add(app);
    commands.emplace_back(app.get_subcommand(entry.name), std::move(run));
  }
  if (argc > 1 && argv[1][0] != '-' &&
      std::none_of(std::begin(kCommands), std::end(kCommands),
                   [&](const CommandEntry& c) { return std::string(argv[1]) == c.name; })) {
    std::string best;
    size_t best_distance = kMaxSuggestionDistance + 1;
    for (const auto& c : kCommands) {
      const size_t d = edit_distance(argv[1], c.name);
      if (d < best_distance) {
        best_distance = d;
        best = c.name;
      }
    }
    std::cerr << "batchtune: unknown command '" << argv[1] << "'"
              << (best.empty() ? std::string() : fmt::format(" (did you mean {}?)", best))
              << "; see batchtune --help\n";
    return kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --version
    // The command's own help, and a suggestion for a mistyped flag.
    const CLI::App* command = nullptr;
    if (argc > 1) {
      for (const auto& [cmd, run] : commands) {
        if (cmd->get_name() == argv[1]) command = cmd;
      }
    }
    if (command == nullptr) {
      std::cerr << "batchtune: " << e.what() << "; see batchtune --help\n";
      return kExitBadInput;
    }
    const std::string hint = unknown_flag_hint(*command, argc, argv);
    std::cerr << "batchtune " << command->get_name() << ": " << (hint.empty() ? e.what() : hint)
              << "; see batchtune " << command->get_name() << " --help\n";
    return kExitBadInput;
  }
  try {
    for (auto& [cmd, run] : commands) {
      if (!cmd->parsed()) continue;
      const int code = run();
      // What went to stdout must have arrived: a full stdout is an error.
      std::cout.flush();
      if (std::cout.fail() || std::fflush(stdout) != 0) {
        std::cerr << "batchtune: standard output: cannot write (" << std::strerror(errno)
                  << "); check the disk or pipe it goes to\n";
        return kExitBadInput;
      }
      return code;
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
