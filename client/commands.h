// Subcommands of the `sftctl` CLI. Each command lives in its own cmd_<name>.cpp and
// registers itself on the CLI11 app; its callback stores the process exit code in `ctx`.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

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
// Remote commands (docs/remote.md): submit, logs, pull, status/list/cancel (cmd_jobs.cpp), plot.
void RegisterSubmitCommand(CLI::App& app, CommandContext& ctx);
void RegisterLogsCommand(CLI::App& app, CommandContext& ctx);
void RegisterPullCommand(CLI::App& app, CommandContext& ctx);
void RegisterJobCommands(CLI::App& app, CommandContext& ctx);
void RegisterPlotCommand(CLI::App& app, CommandContext& ctx);
// `download`: a Hugging Face Hub repository into the local cache (cmd_download.cpp).
void RegisterDownloadCommand(CLI::App& app, CommandContext& ctx);

}  // namespace sftctl::client
