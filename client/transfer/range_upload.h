// Range uploads: one large file sent to the agent as fixed-size blocks over several connections at
// once (UploadBlob with offset + length + block; agent/state/blob_store.h "Ranged uploads").
//
// The blocks the agent already holds (StatBlob's blocks_held, when its block size is ours) are not sent
// again. Each worker, on its own SSH connection (the first through the caller's Reconnector, the others
// through its factory), takes the next block not yet sent and streams it; a block whose stream drops is
// sent again whole after a reconnect. How many workers: `options.connections` > 0 fixes the number; 0
// chooses it from measured throughput, up to kMaxUploadConnections (client/remote/connection_ramp.h, the
// policy range pulls use too). The agent hashes the blocks in order as they complete and answers the block
// that completes the blob with complete = true once the whole verifies; a whole that does not verify is
// deleted there (DATA_LOSS).
//
// Thread safety: called by one thread; it owns its workers until it returns.
#pragma once

#include <cstdint>
#include <string>

#include "client/remote/agent_session.h"
#include "client/transfer/blob_stream.h"
#include "client/transfer/progress.h"
#include "common/os/clock.h"
#include "common/status.h"

namespace sftctl::client {

constexpr uint64_t kUploadBlockBytes = 8ull << 20;
constexpr int kMaxUploadConnections = 8;
// Files smaller than this are uploaded as one stream.
constexpr uint64_t kMinRangeUploadBytes = 2 * kUploadBlockBytes;

struct RangeUploadOptions {
  int connections = 0;  // > 0: exactly this many connections; 0: chosen from measured throughput
  uint64_t block_bytes = kUploadBlockBytes;
  const Clock* clock = Clock::Real();  // the connection ramp's time (tests move it)
};

// Sends the blocks of `local_path` (`size` bytes, `sha256`) that `held` (the agent's StatBlob answer)
// does not list. Progress counts the bytes held before and the bytes sent. Errors: DATA_LOSS (the whole
// did not verify on the agent: the file changed while it was read), UNAVAILABLE (a connection could not
// be resumed), the agent's, local read errors.
Status UploadRanges(Reconnector* rc, const std::string& local_path, uint64_t size, const std::string& sha256,
                    const v1::BlobStatus& held, const RangeUploadOptions& options, Progress* progress,
                    UploadStats* stats);

}  // namespace sftctl::client
