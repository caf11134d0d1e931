// The bytes of one UploadBlob stream: the chunk loop shared by whole-file uploads (uploader.h) and
// the ranged blocks of large files (range_upload.h), and what both count.
//
// Thread safety: WriteBlobStream uses only its arguments (one stream per call).
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"
#include "sftctl/v1/agent.grpc.pb.h"

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

}  // namespace sftctl::client
