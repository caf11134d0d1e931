// `sftctl eval --model DIR --data FILE.jsonl [--dump-logits OUT]`: loss and perplexity of a model
// folder on a dataset, with the training masking rules; with --generate, exact-match/contains
// scores of generations against the records' references (runs sftctl-trainer eval; its flags come
// from common/cli/trainer_flags.h, checked here and passed on as given).
#include "client/commands/commands.h"
#include "client/local/trainer_exec.h"
#include "common/cli/trainer_flags.h"

namespace sftctl::client {

void RegisterEvalCommand(CLI::App& app, CommandContext& ctx) {
  const cli::TrainerCommandDef* def = &cli::EvalCommandDef();
  CLI::App* cmd = cli::AddForwardingCommand(app, *def);
  cmd->callback([cmd, def, &ctx] { ctx.exit_code = RunTrainer(cli::ForwardedArgs(*cmd, *def)); });
}

}  // namespace sftctl::client
