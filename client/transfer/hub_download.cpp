#include "client/transfer/hub_download.h"

#include <iostream>
#include <memory>

#include "client/remote/remote_options.h"  // StderrIsTty
#include "client/transfer/progress.h"
#include "common/hub/hub_spec.h"
#include "common/spec/spec_paths.h"
#include "common/terminal_text.h"

namespace sftctl::client {
namespace {

// Environment options with a progress line per file on a terminal.
HubOptions LocalOptions(std::shared_ptr<std::unique_ptr<Progress>> bar) {
  HubOptions o = HubOptionsFromEnvironment();
  auto last = std::make_shared<std::pair<std::string, uint64_t>>();
  o.progress = [bar, last](const std::string& file, uint64_t done, uint64_t total) {
    if (!*bar || last->first != file || done < last->second) {
      if (*bar) (*bar)->Finish();
      *bar = std::make_unique<Progress>(StderrIsTty(), total);
      (*bar)->SetLabel(file);  // the Hub's file name, escaped by Progress
      *last = {file, 0};
    }
    (*bar)->Add(done - last->second);
    last->second = done;
  };
  return o;
}

}  // namespace

StatusOr<HubSnapshot> DownloadFromHub(const HubRef& ref, const std::vector<std::string>& include) {
  auto bar = std::make_shared<std::unique_ptr<Progress>>();
  HubDownloader downloader(LocalOptions(bar));
  StatusOr<HubSnapshot> snap = downloader.Download(ref, include);
  if (*bar) (*bar)->Finish();
  return snap;
}

Status ResolveHubPathsLocally(JobSpec* spec, bool tokenizer_only) {
  const std::vector<SpecHubPath> paths = HubPaths(*spec);
  if (paths.empty()) return OkStatus();
  auto bar = std::make_shared<std::unique_ptr<Progress>>();
  const HubOptions options = LocalOptions(bar);
  for (const SpecHubPath& p : paths)
    std::cerr << "sftctl: " << EscapeForTerminal(p.field + ": " + p.value + " -> " + options.cache_dir)
              << std::endl;  // the spec's text
  HubDownloader downloader(options);
  // On a copy: `spec` changes only when every path downloaded.
  JobSpec resolved = *spec;
  Status st = ResolveHubSpec(&resolved, &downloader, tokenizer_only);
  if (*bar) (*bar)->Finish();
  SFT_RETURN_IF_ERROR(st);
  *spec = std::move(resolved);
  return OkStatus();
}

}  // namespace sftctl::client
