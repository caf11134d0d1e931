// Pulling files of a job folder from an agent (PullArtifact), resumably and verified.
//
// For each file: a destination that already has the expected sha256 is skipped; one that differs is an
// error naming it (unless `force`). A large file goes as parallel byte ranges (range_pull.h). Otherwise
// the bytes go to "<dest>.part", resumed from its size
// (PullArtifact offset) — after an interrupted run or a dropped stream, which is reconnected and
// retried from the offset a few times (Reconnector) — then the whole file is checked against the
// sha256 the agent sent, fsynced and renamed atomically into place. A resumed .part that does not
// verify is discarded and fetched once more from the start.
//
// Thread safety: one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "client/remote/agent_session.h"
#include "client/transfer/progress.h"
#include "common/status.h"

namespace sftctl::client {

struct PullItem {
  std::string remote_path;  // relative to the job folder, e.g. "run/checkpoint-000004/model.safetensors"
  std::string local_path;   // destination
  uint64_t size = 0;        // as listed (for progress)
  std::string sha256;       // as listed; empty: only the stream's own sha256 is checked
};

struct PullStats {
  int files_fetched = 0;
  int files_skipped = 0;  // already present with the right sha256
  uint64_t bytes_fetched = 0;
  uint64_t bytes_skipped = 0;
  int streams = 1;  // the most connections one file was pulled over
};

// The agent is not trusted with the size either: a listed size over kMaxPullBytes or the free space
// is refused before anything is written, and a stream is cut at the size listed (a sha256 listing) or,
// for a file listed without one, at the size its stream declares (itself checked for room).
// Errors: ALREADY_EXISTS (a differing destination without force), RESOURCE_EXHAUSTED (the size, as
// range_pull.h's CheckPullRoom), DATA_LOSS (sha256 mismatch after a fresh download; a stream past its
// declared size or out of order, whose .part is removed), UNAVAILABLE (the connection could not be
// resumed), the agent's (NOT_FOUND, ...), local I/O errors.
// `streams`: for a file of at least kMinRangePullBytes with a listed sha256, how many connections
// pull its byte ranges at once, each with kLanesPerConnection range streams (range_pull.h): 0 chooses
// from measured throughput.
Status PullFile(Reconnector* rc, const std::string& job_id, const PullItem& item, bool force,
                Progress* progress, PullStats* stats, int streams = 0);

}  // namespace sftctl::client
