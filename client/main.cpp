// sftctl: fine-tune LLMs the same way on a laptop and on rented GPUs.
#include <CLI/CLI.hpp>

#include "client/commands.h"
#include "common/version.h"

int main(int argc, char** argv) {
  CLI::App app{"sftctl: fine-tune LLMs the same way on this machine and on rented GPU hosts"};
  app.set_version_flag("--version", std::string("sftctl ") + sftctl::kVersion);
  app.require_subcommand(1);
  app.fallthrough(false);

  sftctl::client::CommandContext ctx;
  ctx.argv0 = argv[0];
  sftctl::client::RegisterRunCommand(app, ctx);
  sftctl::client::RegisterGenerateCommand(app, ctx);
  sftctl::client::RegisterTokenizeCommand(app, ctx);
  sftctl::client::RegisterInspectDataCommand(app, ctx);
  sftctl::client::RegisterEvalCommand(app, ctx);
  sftctl::client::RegisterExportCommand(app, ctx);

  CLI11_PARSE(app, argc, argv);
  return ctx.exit_code;
}
