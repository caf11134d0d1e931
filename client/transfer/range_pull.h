// Range pulls: one large file fetched as byte ranges over several agent connections at once, for
// links where one stream cannot fill the pipe (a window per RTT) or one core cannot decrypt fast enough.
//
// The file is cut into fixed blocks (8 MiB) handed out in order to up to `max_streams` connections, each
// its own SSH connection (its own session, pump thread and gRPC channel: sessions, not channels of one
// session, so that decryption spreads over cores). Each connection streams `lanes` blocks at once, one
// PullArtifact range (offset + length) per block, and writes each at its place in "<dest>.part". Lanes
// exist because one gRPC stream moves at most about 1 MiB per round trip through gRPC 1.51 (Debian's),
// whatever window is asked for, and a connection's window grows only with its streams' reads: at 100 ms
// round trips one connection moved 7 MiB/s with 1 lane, 9 with 4 and 21-24 with 16 (bench/README.md,
// "wan"). A dropped connection resumes every lane's block from the byte it reached, through the
// connection's own Reconnector. The calling thread hashes the blocks in file order as soon as each is
// complete (from the page cache, while later blocks still arrive): the sha256 is pipelined with receiving,
// not a second pass after it. Workers never run more than a window of blocks ahead of the hash.
//
// How many connections: `options.max_streams` > 0 fixes the number; 0 chooses it from measured throughput
// (up to kMaxAutoStreams), as client/remote/connection_ramp.h does for uploads too.
//
// Resuming across runs: "<dest>.part.ranges" records the file's size and sha256 and each completed
// block (appended as it completes). A new run re-uses the blocks it lists when size and sha256 still
// match (else both files are discarded), and hashes them from the .part. A .part left by a one-stream
// pull counts as its complete blocks. Every range's first chunk carries the file's size and sha256:
// a file that changed on the host between ranges is refused (DATA_LOSS) rather than stitched together.
//
// Thread safety: PullRanges is called by one thread; it owns its workers until it returns.
#pragma once

#include <cstdint>
#include <string>

#include "client/remote/agent_session.h"
#include "client/transfer/progress.h"
#include "common/os/clock.h"
#include "common/status.h"

namespace sftctl::client {

constexpr uint64_t kRangeBlockBytes = 8ull << 20;
constexpr int kMaxAutoStreams = 4;
constexpr int kLanesPerConnection = 16;
// Files smaller than this are pulled as one stream.
constexpr uint64_t kMinRangePullBytes = 2 * kRangeBlockBytes;

// The largest file a pull accepts: an agent that lists more is refused before anything is allocated
// for the file or written.
constexpr uint64_t kMaxPullBytes = 4ull << 40;

// Whether `size` bytes of the agent's `remote_path` may be written to `part`: at most kMaxPullBytes, and
// no more than the space free in part's folder (its nearest existing ancestor) beyond what `part`
// already holds. RESOURCE_EXHAUSTED naming the file otherwise.
Status CheckPullRoom(const std::string& remote_path, uint64_t size, const std::string& part);

struct RangePullOptions {
  int max_streams = 0;  // > 0: exactly this many connections; 0: chosen from measured throughput
  uint64_t block_bytes = kRangeBlockBytes;
  int lanes = kLanesPerConnection;     // ranges streamed at once per connection
  const Clock* clock = Clock::Real();  // the connection ramp's time (tests move it)
};

struct RangePullResult {
  uint64_t bytes_fetched = 0;    // received by this call
  bool resumed = false;          // blocks of an earlier run were re-used
  int streams = 0;               // the most workers that ran at once
  bool digest_mismatch = false;  // the whole did not verify (the .part was removed)
};

// Fetches `remote_path` (`size` bytes, `sha256`; both as listed, REQUIRES: sha256 non-empty) of job
// `job_id` into `part`, which ends complete, verified and fsynced; removes "<part>.ranges".
// `rc` is used by the first worker; the others connect through rc->factory().
// Errors: RESOURCE_EXHAUSTED (CheckPullRoom: checked first, before anything is allocated for the
// file's blocks), DATA_LOSS (the file changed on the host between ranges, or the whole does not
// verify; the .part is removed then), UNAVAILABLE (a worker could not resume), the agent's, local I/O
// errors.
Status PullRanges(Reconnector* rc, const std::string& job_id, const std::string& remote_path, uint64_t size,
                  const std::string& sha256, const std::string& part, const RangePullOptions& options,
                  Progress* progress, RangePullResult* result);

}  // namespace sftctl::client
