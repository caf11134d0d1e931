// `sftctl generate --model DIR (--prompt TEXT | --prompts FILE.jsonl)`: continue prompts with a
// checkpoint (runs sftctl-trainer generate; docs/generate.md). The flags are sftctl-trainer's, from
// common/cli/trainer_flags.h: checked here, then passed on as given.
#include "client/commands/commands.h"
#include "client/local/trainer_exec.h"
#include "common/cli/trainer_flags.h"

namespace sftctl::client {

void RegisterGenerateCommand(CLI::App& app, CommandContext& ctx) {
  const cli::TrainerCommandDef* def = &cli::GenerateCommandDef();
  CLI::App* cmd = cli::AddForwardingCommand(app, *def);
  cmd->callback([cmd, def, &ctx] { ctx.exit_code = RunTrainer(cli::ForwardedArgs(*cmd, *def)); });
}

}  // namespace sftctl::client
