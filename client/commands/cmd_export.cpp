// `sftctl export --model DIR [--merge --adapter DIR] -o OUT`: write a Hugging Face model folder,
// optionally with a LoRA adapter merged into the weights; `--gguf OUT.gguf [--type f16|q8_0|f32]`
// writes one GGUF file instead (llama.cpp, ollama). Runs sftctl-trainer export; its flags come from
// common/cli/trainer_flags.h, checked here and passed on as given.
#include "client/commands/commands.h"
#include "client/local/trainer_exec.h"
#include "common/cli/trainer_flags.h"

namespace sftctl::client {

void RegisterExportCommand(CLI::App& app, CommandContext& ctx) {
  const cli::TrainerCommandDef* def = &cli::ExportCommandDef();
  CLI::App* cmd = cli::AddForwardingCommand(app, *def);
  cmd->callback([cmd, def, &ctx] { ctx.exit_code = RunTrainer(cli::ForwardedArgs(*cmd, *def)); });
}

}  // namespace sftctl::client
