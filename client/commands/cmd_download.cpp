// `sftctl download REPO[@REV] [--include PATTERN]...`: downloads a model (or, with datasets/, a data
// set's files) from the Hugging Face Hub into the local HF cache, as the agent does for hf:// paths,
// and prints the snapshot folder on stdout (progress and errors on stderr).
#include <iostream>

#include "client/commands/commands.h"
#include "client/remote/remote_options.h"
#include "client/transfer/hub_download.h"
#include "client/transfer/progress.h"  // FormatBytes
#include "common/terminal_text.h"

namespace sftctl::client {
namespace {

struct DownloadArgs {
  std::string repo;
  std::vector<std::string> include;
};

int Download(const DownloadArgs& a) {
  const std::string text = IsHubPath(a.repo) ? a.repo : std::string(kHubScheme) + a.repo;
  StatusOr<HubRef> ref = ParseHubRef(text);
  if (!ref.ok()) return ReportError(ref.status(), false);
  StatusOr<HubSnapshot> snap = DownloadFromHub(*ref, a.include);
  if (!snap.ok()) return ReportError(snap.status(), false);
  std::cerr << "sftctl: " << snap->files.size() << " file(s), " << snap->files_downloaded << " downloaded ("
            << FormatBytes(snap->bytes_downloaded) << "), commit " << EscapeForTerminal(snap->commit)
            << std::endl;
  // Not escaped: scripts read this path. Past the user's own cache folder it holds only what
  // ParseHubRef and HubDownloader checked (names, 40 hex digits, a CheckRelativePath path).
  std::cout << snap->path << std::endl;
  return 0;
}

}  // namespace

void RegisterDownloadCommand(CLI::App& app, CommandContext& ctx) {
  auto args = std::make_shared<DownloadArgs>();
  auto* cmd = app.add_subcommand(
      "download",
      "Download a model or data set from the Hugging Face Hub into the local cache; prints its folder");
  cmd->add_option("repo", args->repo,
                  "ORG/NAME[@REVISION][/PATH], or datasets/ORG/NAME[@REVISION]/PATH (hf:// optional)")
      ->required();
  cmd->add_option("--include", args->include,
                  "Only files matching this shell pattern (repeatable), instead of config, tokenizer and "
                  "safetensors files");
  cmd->callback([args, &ctx] { ctx.exit_code = Download(*args); });
}

}  // namespace sftctl::client
