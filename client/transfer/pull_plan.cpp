#include "client/transfer/pull_plan.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "common/checkpoint_name.h"
#include "common/json_parse.h"
#include "common/os/file_system.h"
#include "common/safe_path.h"

namespace sftctl::client {
namespace {

constexpr std::string_view kRunPrefix = "run/";

std::string JoinSteps(const std::set<int64_t>& steps) {
  std::string s;
  for (int64_t v : steps) s += (s.empty() ? "" : ", ") + std::to_string(v);
  return s.empty() ? "none" : s;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::set<int64_t> CompleteSteps(const v1::ListArtifactsResponse& list) {
  std::set<int64_t> complete;
  for (const auto& art : list.artifacts()) {
    if (art.path().rfind("run/checkpoint-", 0) == 0 && art.checkpoint_step() >= 0 &&
        art.checkpoint_complete()) {
      complete.insert(art.checkpoint_step());
    }
  }
  return complete;
}

StatusOr<int64_t> ChooseStep(const v1::ListArtifactsResponse& list, int64_t step,
                             const std::string& job_ref) {
  const std::set<int64_t> complete = CompleteSteps(list);
  if (step >= 0) {
    if (complete.count(step) == 0) {
      return NotFoundError(job_ref + " has no complete checkpoint at step " + std::to_string(step) +
                           " (complete: " + JoinSteps(complete) + ")");
    }
    return step;
  }
  if (complete.empty()) {
    return FailedPreconditionError(job_ref + " has no complete checkpoint yet (see `sftctl status " +
                                   job_ref + "`)");
  }
  return *complete.rbegin();
}

// The pull state (kPullStateFile): pulled checkpoint folder -> the step the agent listed for it.
using PullState = std::map<std::string, int64_t>;

std::string StatePath(const std::string& dir) { return JoinPath(dir, kPullStateFile); }

// A name the state may hold: one plain path component.
bool IsFolderName(const std::string& name) {
  return CheckRelativePath(name).ok() && name.find('/') == std::string::npos;
}

// The state of `dir`; empty when there is none or it cannot be read (then nothing is removed).
PullState LoadPullState(const std::string& dir) {
  PullState state;
  auto text = FileSystem::Default()->ReadFile(StatePath(dir));
  if (!text.ok()) return state;
  auto j = ParseJson(*text, StatePath(dir));
  if (!j.ok() || !j->is_object() || !j->contains("checkpoints") || !(*j)["checkpoints"].is_array())
    return state;
  for (const auto& e : (*j)["checkpoints"]) {
    if (!e.is_object() || !e.contains("folder") || !e["folder"].is_string() || !e.contains("step") ||
        !e["step"].is_number_integer())
      continue;
    const std::string folder = e["folder"].get<std::string>();
    if (IsFolderName(folder)) state[folder] = e["step"].get<int64_t>();
  }
  return state;
}

Status SavePullState(const std::string& dir, const PullState& state) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [folder, step] : state) list.push_back({{"folder", folder}, {"step", step}});
  const nlohmann::json j = {{"version", 1}, {"checkpoints", list}};
  return WriteFileAtomic(FileSystem::Default(), StatePath(dir), j.dump(1) + "\n");
}

// A pulled folder as it is on disk now.
struct PulledFolder {
  int64_t step;
  std::string folder;
  bool complete;
};

// The recorded folders that are still folders (not links), newest listed step first.
std::vector<PulledFolder> PresentFolders(const std::string& dir, const PullState& state) {
  FileSystem* fs = FileSystem::Default();
  std::vector<PulledFolder> present;
  for (const auto& [folder, step] : state) {
    const std::string path = JoinPath(dir, folder);
    std::error_code ec;
    if (std::filesystem::is_symlink(path, ec) || !fs->IsDirectory(path)) continue;
    present.push_back({step, folder, fs->Exists(path + "/DONE")});
  }
  std::sort(present.begin(), present.end(), [](const PulledFolder& a, const PulledFolder& b) {
    return a.step != b.step ? a.step > b.step : a.folder > b.folder;
  });
  return present;
}

}  // namespace

int64_t NewestCompleteStep(const v1::ListArtifactsResponse& list) {
  const std::set<int64_t> complete = CompleteSteps(list);
  return complete.empty() ? -1 : *complete.rbegin();
}

StatusOr<bool> RecordPulledCheckpoint(const std::string& dir, const std::string& folder, int64_t step) {
  if (!IsFolderName(folder)) return false;
  PullState state = LoadPullState(dir);
  auto it = state.find(folder);
  if (it == state.end()) {
    std::error_code ec;
    if (std::filesystem::symlink_status(JoinPath(dir, folder), ec).type() !=
        std::filesystem::file_type::not_found) {
      return false;  // there before this tool pulled anything into it: the user's
    }
  } else if (it->second == step) {
    return true;
  }
  state[folder] = step;
  SFT_RETURN_IF_ERROR(SavePullState(dir, state));
  return true;
}

StatusOr<int> KeepNewestCheckpoints(const std::string& dir, int keep) {
  const PullState state = LoadPullState(dir);
  const std::vector<PulledFolder> present = PresentFolders(dir, state);
  auto newest =
      std::find_if(present.begin(), present.end(), [](const PulledFolder& f) { return f.complete; });
  if (newest == present.end()) return 0;
  PullState left;
  int kept = 0, removed = 0;
  for (const PulledFolder& f : present) {
    if (f.complete && kept < keep) {
      ++kept;
    } else if (f.step < newest->step) {
      SFT_RETURN_IF_ERROR(FileSystem::Default()->RemoveAll(JoinPath(dir, f.folder)));
      ++removed;
      continue;
    }
    left[f.folder] = f.step;
  }
  if (left != state) SFT_RETURN_IF_ERROR(SavePullState(dir, left));
  return removed;
}

LocalCheckpoints ScanLocalCheckpoints(const std::string& dir) {
  LocalCheckpoints out;
  int64_t newest = -1;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const int64_t step = CheckpointStep(name);
    if (step < 0 || e.is_symlink(ec) || !e.is_directory(ec)) continue;
    if (!std::filesystem::exists(e.path() / "DONE", ec)) {
      out.partial.push_back(e.path().string());
    } else if (step > newest) {
      newest = step;
      out.newest_complete = e.path().string();
    }
  }
  std::sort(out.partial.begin(), out.partial.end());
  return out;
}

bool IsRunTopLevelFile(std::string_view remote_path) {
  return remote_path.rfind(kRunPrefix, 0) == 0 &&
         remote_path.find('/', kRunPrefix.size()) == std::string_view::npos;
}

bool IsCompletionMarker(std::string_view rel_path) {
  return rel_path == "DONE" || EndsWith(rel_path, "/DONE");
}

StatusOr<PullPlan> PlanPull(const v1::ListArtifactsResponse& list, int64_t step, const std::string& dir,
                            const std::string& job_ref) {
  PullPlan plan;
  SFT_ASSIGN_OR_RETURN(plan.step, ChooseStep(list, step, job_ref));
  for (const auto& art : list.artifacts()) {
    if (art.path().rfind(kRunPrefix, 0) != 0) continue;
    const std::string rel = art.path().substr(kRunPrefix.size());
    const bool top = IsRunTopLevelFile(art.path());
    const bool in_checkpoint = !top && rel.rfind("checkpoint-", 0) == 0 && art.checkpoint_step() == plan.step;
    if (!top && !in_checkpoint) continue;
    if (top && (EndsWith(rel, ".part") || rel == kPullStateFile)) continue;
    auto local = PathBeneath(dir, rel);
    if (!local.ok()) {
      return Status(local.status().code(),
                    job_ref + " lists a file that cannot be pulled safely; nothing was fetched: " +
                        local.status().message());
    }
    if (in_checkpoint) {
      const std::string folder = rel.substr(0, rel.find('/'));
      if (!plan.checkpoint_dir.empty() && folder != plan.checkpoint_dir) {
        return InvalidArgumentError(job_ref + " lists step " + std::to_string(plan.step) +
                                    " in two folders ('" + plan.checkpoint_dir + "' and '" + folder +
                                    "'); nothing was fetched");
      }
      plan.checkpoint_dir = folder;
    }
    plan.items.push_back({art.path(), *local, art.size(), art.sha256()});
    plan.total_bytes += art.size();
  }
  // Markers last: a folder is complete locally only once everything else in it is.
  std::stable_partition(plan.items.begin(), plan.items.end(),
                        [](const PullItem& it) { return !IsCompletionMarker(it.remote_path); });
  return plan;
}

}  // namespace sftctl::client
