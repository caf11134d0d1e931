// Uploading local files to an agent as sha256-addressed blobs (StatBlob, then UploadBlob from the
// offset the agent holds): a blob the agent already has is not sent again, an interrupted upload
// resumes where it stopped, and a dropped connection is reconnected and resumed (Reconnector). A file
// of kMinRangeUploadBytes or more goes as blocks over several connections (range_upload.h).
//
// Thread safety: one thread at a time.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "client/remote/agent_session.h"
#include "client/transfer/blob_stream.h"
#include "client/transfer/progress.h"
#include "common/status.h"

namespace sftctl::client {

// Makes sure the agent holds the blob of `local_path` (`size` bytes, `sha256`). Progress counts the
// bytes sent (and, for a resumed upload, the bytes the agent already held).
// Errors: the agent's (DATA_LOSS when the file changed while it was read, RESOURCE_EXHAUSTED for a
// full disk, ...), UNAVAILABLE when the connection could not be resumed, or the local read error.
Status UploadFile(Reconnector* rc, const std::string& local_path, uint64_t size, const std::string& sha256,
                  Progress* progress, UploadStats* stats);

}  // namespace sftctl::client
