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

#include "client/agent_session.h"
#include "client/progress.h"
#include "common/status.h"

namespace sftctl::client {

// Data bytes per UploadBlob message, sequential and ranged uploads alike.
constexpr size_t kUploadChunkBytes = 1 << 20;

// The one way an UploadBlob stream carries file bytes, for whole files and ranged blocks alike: writes
// `first` (the stream's header), then bytes [from, to) of `fd` (read from `path`, named in errors) as
// data messages of kUploadChunkBytes, calling on_sent(n) after each went out, and WritesDone when the
// stream held. A local read error cancels the stream through `ctx` and lands in *read_error (else OK).
// Returns the offset reached. The caller then calls Finish.
uint64_t WriteBlobStream(grpc::ClientContext* ctx, grpc::ClientWriterInterface<v1::UploadBlobRequest>* writer,
                         const v1::UploadBlobRequest& first, int fd, const std::string& path, uint64_t from,
                         uint64_t to, const std::function<void(size_t)>& on_sent, Status* read_error);

struct UploadStats {
  int files_sent = 0;       // files of which this process sent bytes
  int files_unchanged = 0;  // already complete on the agent
  uint64_t bytes_sent = 0;
  uint64_t bytes_unchanged = 0;
};

// Makes sure the agent holds the blob of `local_path` (`size` bytes, `sha256`). Progress counts the
// bytes sent (and, for a resumed upload, the bytes the agent already held).
// Errors: the agent's (DATA_LOSS when the file changed while it was read, RESOURCE_EXHAUSTED for a
// full disk, ...), UNAVAILABLE when the connection could not be resumed, or the local read error.
Status UploadFile(Reconnector* rc, const std::string& local_path, uint64_t size, const std::string& sha256,
                  Progress* progress, UploadStats* stats);

}  // namespace sftctl::client
