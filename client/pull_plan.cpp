#include "client/pull_plan.h"

#include <algorithm>
#include <set>

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

StatusOr<int64_t> ChooseStep(const v1::ListArtifactsResponse& list, int64_t step,
                             const std::string& job_ref) {
  std::set<int64_t> complete;
  for (const auto& art : list.artifacts()) {
    if (art.path().rfind("run/checkpoint-", 0) == 0 && art.checkpoint_step() >= 0 &&
        art.checkpoint_complete()) {
      complete.insert(art.checkpoint_step());
    }
  }
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

}  // namespace

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
    const bool top = rel.find('/') == std::string::npos;
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
