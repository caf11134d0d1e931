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

// The generation flags `generate` and `eval --generate` share (cmd_generate.cpp), passed through
// to sftctl-trainer as they are (docs/generate.md).
struct GenerationArgs {
  int64_t max_new_tokens = 64;
  double temperature = 0, top_p = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool chat = false;
  std::string system, chat_template;
  // The trainer's flags for these values.
  std::vector<std::string> ToTrainerArgs() const;
};
// Adds --max-new-tokens, --temperature, --top-p, --top-k, --seed, --stop, --chat, --system and
// --chat-template to `cmd`, stored into `*a` (kept alive by the caller's callback).
void AddGenerationArgs(CLI::App* cmd, const std::shared_ptr<GenerationArgs>& a);

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
// `bootstrap`: build, install and start the agent and trainer on a fresh GPU host (cmd_bootstrap.cpp).
void RegisterBootstrapCommand(CLI::App& app, CommandContext& ctx);

}  // namespace sftctl::client
