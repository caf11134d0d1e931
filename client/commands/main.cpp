// sftctl: fine-tune LLMs the same way on a laptop and on rented GPUs.
#include <CLI/CLI.hpp>

#include "client/commands/commands.h"
#include "common/source_id.h"
#include "common/version.h"

int main(int argc, char** argv) {
  CLI::App app{"sftctl: fine-tune LLMs the same way on this machine and on rented GPU hosts"};
  app.set_version_flag("--version", std::string("sftctl ") + sftctl::kVersion + " (source " +
                                        sftctl::ShortSourceId(sftctl::SourceId()) + ")");
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
  sftctl::client::RegisterSubmitCommand(app, ctx);
  sftctl::client::RegisterLogsCommand(app, ctx);
  sftctl::client::RegisterPullCommand(app, ctx);
  sftctl::client::RegisterJobCommands(app, ctx);
  sftctl::client::RegisterPlotCommand(app, ctx);
  sftctl::client::RegisterDownloadCommand(app, ctx);
  sftctl::client::RegisterBootstrapCommand(app, ctx);
  sftctl::client::RegisterSpecCommand(app, ctx);
  sftctl::client::RegisterCloudCommands(app, ctx);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help and --version exit 0; a usage error exits 2 ("fix your input"), like every other input error.
    return app.exit(e) == 0 ? 0 : 2;
  }
  return ctx.exit_code;
}
