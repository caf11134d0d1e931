#include "client/pull_plan.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "common/file_system.h"
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

// The step of a local folder named checkpoint-<digits>, -1 for any other name.
int64_t LocalCheckpointStep(const std::string& name) {
  static const std::string kPrefix = "checkpoint-";
  if (name.rfind(kPrefix, 0) != 0 || name.size() == kPrefix.size() || name.size() > kPrefix.size() + 18)
    return -1;
  int64_t step = 0;
  for (size_t i = kPrefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

}  // namespace

int64_t NewestCompleteStep(const v1::ListArtifactsResponse& list) {
  const std::set<int64_t> complete = CompleteSteps(list);
  return complete.empty() ? -1 : *complete.rbegin();
}

StatusOr<int> KeepNewestCheckpoints(const std::string& dir, int keep) {
  FileSystem* fs = FileSystem::Default();
  SFT_ASSIGN_OR_RETURN(std::vector<std::string> names, fs->ListDir(dir));
  std::map<int64_t, std::string> folders;  // checkpoint folders (never a link) by step
  std::set<int64_t, std::greater<>> complete;
  for (const std::string& name : names) {
    const int64_t step = LocalCheckpointStep(name);
    const std::string path = JoinPath(dir, name);
    std::error_code ec;
    if (step < 0 || std::filesystem::is_symlink(path, ec) || !fs->IsDirectory(path)) continue;
    folders[step] = name;
    if (fs->Exists(path + "/DONE")) complete.insert(step);
  }
  if (complete.empty()) return 0;
  std::set<int64_t> kept;
  for (int64_t step : complete) {
    if (static_cast<int>(kept.size()) == keep) break;
    kept.insert(step);
  }
  int removed = 0;
  for (const auto& [step, name] : folders) {
    if (step >= *complete.begin() || kept.count(step) > 0) continue;
    SFT_RETURN_IF_ERROR(fs->RemoveAll(JoinPath(dir, name)));
    ++removed;
  }
  return removed;
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
    const bool in_checkpoint = rel.rfind("checkpoint-", 0) == 0 && art.checkpoint_step() == plan.step;
    if (!top && !in_checkpoint) continue;
    if (top && EndsWith(rel, ".part")) continue;
    auto local = PathBeneath(dir, rel);
    if (!local.ok()) {
      return Status(local.status().code(),
                    job_ref + " lists a file that cannot be pulled safely; nothing was fetched: " +
                        local.status().message());
    }
    if (in_checkpoint) plan.checkpoint_dir = rel.substr(0, rel.find('/'));
    plan.items.push_back({art.path(), *local, art.size(), art.sha256()});
    plan.total_bytes += art.size();
  }
  // Markers last: a folder is complete locally only once everything else in it is.
  std::stable_partition(plan.items.begin(), plan.items.end(),
                        [](const PullItem& it) { return !IsCompletionMarker(it.remote_path); });
  return plan;
}

}  // namespace sftctl::client
