// Subcommands of the `sftctl` CLI. Each command lives in its own cmd_<name>.cpp and
// registers itself on the CLI11 app; its callback stores the process exit code in `ctx`.
#pragma once

#include <CLI/CLI.hpp>

namespace sftctl::client {

struct CommandContext {
  int exit_code = 0;
  // argv[0] of this process, used to find sibling binaries (sftctl-trainer, sftd).
  std::string argv0;
};

void RegisterRunCommand(CLI::App& app, CommandContext& ctx);
void RegisterGenerateCommand(CLI::App& app, CommandContext& ctx);
void RegisterTokenizeCommand(CLI::App& app, CommandContext& ctx);
void RegisterInspectDataCommand(CLI::App& app, CommandContext& ctx);
void RegisterEvalCommand(CLI::App& app, CommandContext& ctx);
void RegisterExportCommand(CLI::App& app, CommandContext& ctx);

}  // namespace sftctl::client
