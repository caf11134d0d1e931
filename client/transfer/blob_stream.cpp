#include "client/transfer/blob_stream.h"

#include <algorithm>

#include "common/os/file_system.h"

namespace sftctl::client {

uint64_t WriteBlobStream(grpc::ClientContext* ctx, grpc::ClientWriterInterface<v1::UploadBlobRequest>* writer,
                         const v1::UploadBlobRequest& first, int fd, const std::string& path, uint64_t from,
                         uint64_t to, const std::function<void(size_t)>& on_sent, Status* read_error) {
  *read_error = OkStatus();
  bool stream_ok = writer->Write(first);
  std::string buf(kUploadChunkBytes, '\0');
  uint64_t pos = from;
  while (stream_ok && pos < to) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kUploadChunkBytes, to - pos));
    *read_error = PreadFully(fd, buf.data(), n, pos, path);
    if (!read_error->ok()) {
      ctx->TryCancel();
      break;
    }
    v1::UploadBlobRequest chunk;
    chunk.set_data(buf.data(), n);
    stream_ok = writer->Write(chunk);
    if (!stream_ok) break;
    pos += n;
    on_sent(n);
  }
  if (stream_ok) writer->WritesDone();
  return pos;
}

}  // namespace sftctl::client
