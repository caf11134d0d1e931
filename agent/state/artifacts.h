// Artifacts: the files a job produced (its run folder), with sizes and sha256 (computed once and cached
// in the StateStore by path, size and mtime), and the path check that keeps PullArtifact inside the
// job's own folder.
//
// Thread safety: safe for concurrent use (state lives in the StateStore).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "agent/state/state_store.h"
#include "common/status.h"

namespace sftctl::agent {

struct ArtifactInfo {
  std::string path;  // relative to the job folder
  uint64_t size = 0;
  std::string sha256;
  int64_t mtime_ms = 0;
  int64_t checkpoint_step = -1;
  bool checkpoint_complete = false;
};

// Resolves `rel` to an absolute path of a regular file inside `root`.
// Errors: INVALID_ARGUMENT (empty, absolute, or a ".." component); NOT_FOUND (missing);
// PERMISSION_DENIED (resolves outside `root`, e.g. through a symlink); FAILED_PRECONDITION (not a
// regular file).
StatusOr<std::string> ResolveInside(const std::string& root, const std::string& rel);

class Artifacts {
 public:
  explicit Artifacts(StateStore* store) : store_(store) {}
  // Regular files under <job_dir>/run (symlinks are not followed nor listed), sorted by path.
  StatusOr<std::vector<ArtifactInfo>> List(const std::string& job_id, const std::string& job_dir);
  // sha256 of the file at `abs` (relative name `rel` in the job), from the cache when size and mtime
  // are unchanged.
  StatusOr<std::string> Hash(const std::string& job_id, const std::string& rel, const std::string& abs);

 private:
  StateStore* store_;
};

}  // namespace sftctl::agent
