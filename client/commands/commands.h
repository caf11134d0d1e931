// Subcommands of the `sftctl` CLI. Each command lives in its own cmd_<name>.cpp and
// registers itself on the CLI11 app; its callback stores the process exit code in `ctx`.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sftctl::client {

struct CommandContext {
  int exit_code = 0;
  // argv[0] of this process, used to find sibling binaries (sftctl-trainer, sftd).
  std::string argv0;
};

void RegisterRunCommand(CLI::App& app, CommandContext& ctx);
// generate, eval, export: sftctl-trainer's commands and flags (common/cli/trainer_flags.h).
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
// `bootstrap`: build, install and start the agent and trainer on a fresh GPU host (cmd_bootstrap.cpp).
void RegisterBootstrapCommand(CLI::App& app, CommandContext& ctx);
// `offers`, `up`, `down`, `hosts`: hosts rented through a provider's API (cmd_cloud.cpp).
void RegisterCloudCommands(CLI::App& app, CommandContext& ctx);
// `spec --fields`: the job spec's fields, types and defaults (cmd_spec.cpp, common/spec/spec_fields.h).
void RegisterSpecCommand(CLI::App& app, CommandContext& ctx);

}  // namespace sftctl::client
