// Checkpoints home: one pull of a job's checkpoint and run files into a folder (`sftctl pull`), and
// the loop that keeps the folder in step with a running job until it ends (`pull --follow`,
// `submit --sync-to`). Which files and where: client/transfer/pull_plan.h; how each file comes:
// client/transfer/puller.h.
//
// Both print what they pulled (a line per checkpoint: its folder on stdout and a summary on stderr,
// or one JSON object per line with `json`) and return the command's exit code: an error is reported
// (ReportError); SyncCheckpoints returns the job's final state as `logs -f` does.
//
// Thread safety: one thread per Reconnector; two syncs may run at once on different connections
// (each output line is written with one call).
#pragma once

#include <cstdint>
#include <string>

#include "client/remote/agent_session.h"
#include "client/remote/job_registry.h"

namespace sftctl::client {

// The range of `pull --interval` and `submit --sync-interval` (milliseconds).
inline constexpr int64_t kMinSyncIntervalMs = 50;
inline constexpr int64_t kMaxSyncIntervalMs = 3'600'000;

struct SyncOptions {
  std::string dir;         // the local folder, laid out like a `run --local` folder
  double interval_s = 10;  // sync: seconds between checks
  int keep = 0;            // sync: complete checkpoints kept locally; 0 = all
  int streams = 0;         // connections per large file (puller.h)
  bool force = false;      // replace local files that differ from the job's
  bool json = false;
};

// The checkpoint of `step` (< 0: the newest complete one) and the top-level files of `node`'s job.
int PullCheckpoint(const SyncOptions& o, int64_t step, const JobRecord& rec, const NodeRecord& node,
                   Reconnector* rc);

// Pulls each newer complete checkpoint (and the growing top-level files) every o.interval_s until the
// job ends, keeping the newest o.keep of the checkpoints it pulled (never a folder the user put in
// o.dir: pull_plan.h's KeepNewestCheckpoints); interrupted and run again, it fetches only what is
// missing.
// Returns kExitOk / 1 / 3 for SUCCEEDED / FAILED / CANCELLED.
int SyncCheckpoints(const SyncOptions& o, const JobRecord& rec, const NodeRecord& node, Reconnector* rc);

}  // namespace sftctl::client
