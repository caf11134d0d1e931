// Which of a job's artifacts `sftctl pull` fetches, and where they go.
//
// The agent's listing is not trusted (the laptop does not trust the GPU host): every path that
// would be fetched must pass common/safe_path's policy, or the whole plan is refused before a
// byte is written. Files that declare a folder complete (a checkpoint's DONE marker, which the
// trainer trusts to resume from) are fetched last, so an interrupted pull never leaves a folder
// that looks complete.
//
// Thread safety: pure functions of their arguments (PathBeneath looks at the local disk).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "client/transfer/puller.h"
#include "common/status.h"
#include "sftctl/v1/agent.pb.h"

namespace sftctl::client {

struct PullPlan {
  int64_t step = -1;            // the checkpoint's step
  std::string checkpoint_dir;   // its folder, relative to the destination ("checkpoint-000004")
  std::vector<PullItem> items;  // the run's top-level files and the checkpoint's; markers last
  uint64_t total_bytes = 0;
};

// The files of checkpoint `step` (< 0: the newest complete one) and the run's top-level files
// (metrics.jsonl, spec.json; not *.part), placed under `dir` the way `run --local` lays out a
// run folder. `job_ref` names the job in errors.
// Errors: NOT_FOUND (no complete checkpoint at `step`), FAILED_PRECONDITION (no complete
// checkpoint yet; or a symbolic link in the way under `dir`), INVALID_ARGUMENT (the agent listed
// an unsafe path, or the step's files in more than one folder). A top-level file named like the
// pull state (kPullStateFile) is never pulled.
StatusOr<PullPlan> PlanPull(const v1::ListArtifactsResponse& list, int64_t step, const std::string& dir,
                            const std::string& job_ref);

// The step of the newest complete checkpoint the agent lists, -1 when there is none.
int64_t NewestCompleteStep(const v1::ListArtifactsResponse& list);

// The pull state of a destination folder, <dir>/.sftctl-pulled.json: the checkpoint folders
// `pull --follow --keep` (and `submit --sync-to --sync-keep`) pulled into it, each with the step the
// agent listed for it. --keep removes only these: a folder the user put there (or one a pull without
// --keep fetched) is never recorded, so never removed, whatever its name. (PlanPull never lets the
// agent's listing write this file.)
constexpr const char* kPullStateFile = ".sftctl-pulled.json";

// Records, before anything is pulled into it, that `folder` (a checkpoint folder directly under `dir`,
// e.g. "checkpoint-000004"; `dir` exists) holds the agent's step `step`. A folder that exists and is
// not recorded is the user's: it stays unrecorded and the result is false. True when recorded.
StatusOr<bool> RecordPulledCheckpoint(const std::string& dir, const std::string& folder, int64_t step);

// Among the checkpoint folders this tool pulled into `dir` (RecordPulledCheckpoint), ordered by the
// step the agent listed (not by their names): keeps the newest `keep` (>= 1) complete ones (with
// DONE) and removes every other one listed before the newest complete one, complete or not (an
// incomplete one is a partial download of a checkpoint the host has since rotated away). Folders it
// did not pull, links, folders listed after the newest complete one and other entries of `dir` are
// left alone. Returns how many were removed.
StatusOr<int> KeepNewestCheckpoints(const std::string& dir, int keep);

// The checkpoint folders directly in `dir` (named checkpoint-<step>; folders, never links): the newest
// complete one (with DONE) by step, and those without DONE (partial downloads), as paths under `dir`,
// sorted. What a host that replaces a lost one resumes from, and what of the lost run cannot be
// completed any more. A missing `dir` has none.
struct LocalCheckpoints {
  std::optional<std::string> newest_complete;
  std::vector<std::string> partial;
};
LocalCheckpoints ScanLocalCheckpoints(const std::string& dir);

// True for one of the run's top-level files ("run/metrics.jsonl"), as opposed to a checkpoint's.
bool IsRunTopLevelFile(std::string_view remote_path);

// True for a file whose presence declares its folder complete (a checkpoint's "DONE").
bool IsCompletionMarker(std::string_view rel_path);

}  // namespace sftctl::client
