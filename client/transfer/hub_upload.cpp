#include "client/transfer/hub_upload.h"

#include "client/transfer/progress.h"
#include "common/hub/hub_commit.h"
#include "common/object_store/checkpoint_store.h"
#include "common/object_store/hub_destination.h"
#include "common/terminal_text.h"

namespace sftctl::client {

StatusOr<std::unique_ptr<CheckpointUploader>> StartHubUploader(const JobSpec& spec) {
  const bool final_only = spec.checkpoint.upload == "final";
  SFT_ASSIGN_OR_RETURN(
      std::unique_ptr<CheckpointDestination> dest,
      OpenHubDestination(spec.checkpoint.upload_to, HubOptionsFromEnvironment(), final_only));
  CheckpointUploaderOptions o;
  o.run_dir = spec.output_dir;
  o.keep = spec.checkpoint.keep;
  o.final_only = final_only;
  o.log = PrintUploadLine;  // client/transfer/progress.h
  auto up = std::make_unique<CheckpointUploader>(std::move(dest), std::move(o));
  up->Start();
  return up;
}

std::string HubStatusLines(const std::string& upload_to) {
  const std::string url = EscapeForTerminal(upload_to);
  StatusOr<HubRef> ref = ParseHubUploadTarget(upload_to);
  if (!ref.ok()) return "  " + EscapeForTerminal(ref.status().message()) + "\n";
  StatusOr<std::vector<std::string>> listed =
      HubCommitter(HubOptionsFromEnvironment()).ListFiles(ref->repo_id, ref->revision);
  if (!listed.ok()) {
    return "  its checkpoints go to " + url + ", which cannot be read from here (" +
           EscapeForTerminal(listed.status().message()) + ")\n";
  }
  int64_t newest = -1;
  std::string name;  // of the newest
  bool root_model = false;
  for (const std::string& f : *listed) {
    const size_t slash = f.find('/');
    if (slash == std::string::npos) root_model = root_model || f == "config.json";
    if (slash == std::string::npos || f.substr(slash + 1) != "DONE") continue;
    const int64_t step = CheckpointStep(f.substr(0, slash));
    if (step > newest) newest = step, name = EscapeForTerminal(f.substr(0, slash));
  }
  const std::string repo = EscapeForTerminal(ref->repo_id);
  if (newest >= 0) {
    return "  newest complete checkpoint in " + url + ": " + name + " (step " + std::to_string(newest) +
           ")\n  fetch it: sftctl download " + repo + "/" + name + " --include '" + name +
           "/*'; continue from it with resume: set to the folder it prints\n";
  }
  if (root_model)
    return "  its final model is at the root of " + url + " (checkpoint.upload: final): sftctl download " +
           repo + "\n";
  return "  its checkpoints go to " + url + ", which has no complete checkpoint yet\n";
}

}  // namespace sftctl::client
