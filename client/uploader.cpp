#include "client/uploader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "client/range_upload.h"

namespace sftctl::client {
namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

Status UploadFile(Reconnector* rc, const std::string& local_path, uint64_t size, const std::string& sha256,
                  Progress* progress, UploadStats* stats) {
  bool counted_resume = false;
  bool sent_any = false;
  for (;;) {
    auto session = rc->Session();
    Status failure;
    if (!session.ok()) {
      failure = session.status();
    } else {
      AgentSession& a = **session;
      // What does the agent hold?
      v1::StatBlobRequest sreq;
      sreq.set_sha256(sha256);
      v1::BlobStatus held;
      grpc::ClientContext sctx;
      a.Prepare(&sctx);
      failure = FromGrpc(a.stub()->StatBlob(&sctx, sreq, &held), a.host() + ": StatBlob");
      if (failure.ok()) {
        if (held.complete()) {
          if (!sent_any) {
            ++stats->files_unchanged;
            stats->bytes_unchanged += size;
          }
          if (progress && !counted_resume) progress->Add(size);
          return OkStatus();
        }
        // A large file goes as parallel blocks, unless a one-stream upload of it is under way there.
        if (size >= kMinRangeUploadBytes && held.size() == 0 && !sent_any) {
          return UploadRanges(rc, local_path, size, sha256, held, RangeUploadOptions{}, progress, stats);
        }
        uint64_t offset = held.size() > size ? 0 : held.size();
        if (progress && !counted_resume && !sent_any) progress->Add(offset);
        counted_resume = true;
        Fd fd(::open(local_path.c_str(), O_RDONLY | O_CLOEXEC));
        if (fd.get() < 0) return ErrnoError("cannot read", local_path, errno);
        grpc::ClientContext uctx;
        a.Prepare(&uctx, std::chrono::milliseconds(0));
        v1::BlobStatus result;
        auto writer = a.stub()->UploadBlob(&uctx, &result);
        v1::UploadBlobRequest msg;
        msg.set_sha256(sha256);
        msg.set_size(size);
        msg.set_offset(offset);
        bool stream_ok = writer->Write(msg);
        std::string buf(kUploadChunkBytes, '\0');
        Status read_error;
        while (stream_ok && offset < size) {
          ssize_t n = ::pread(fd.get(), buf.data(), std::min<uint64_t>(kUploadChunkBytes, size - offset),
                              static_cast<off_t>(offset));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) {
            read_error = n < 0 ? ErrnoError("cannot read", local_path, errno)
                               : DataLossError("'" + local_path + "' became shorter while it was uploaded");
            uctx.TryCancel();
            break;
          }
          v1::UploadBlobRequest chunk;
          chunk.set_data(buf.data(), static_cast<size_t>(n));
          stream_ok = writer->Write(chunk);
          if (!stream_ok) break;
          offset += static_cast<uint64_t>(n);
          stats->bytes_sent += static_cast<uint64_t>(n);
          sent_any = true;
          if (progress) progress->Add(static_cast<uint64_t>(n));
        }
        if (stream_ok) writer->WritesDone();
        grpc::Status fin = writer->Finish();
        if (!read_error.ok()) return read_error;
        failure = FromGrpc(fin, a.host() + ": upload of '" + local_path + "'");
        if (failure.ok()) {
          if (!result.complete()) {
            return DataLossError(a.host() + ": upload of '" + local_path + "' ended incomplete (" +
                                 std::to_string(result.size()) + " of " + std::to_string(size) + " bytes)");
          }
          if (sent_any) {
            ++stats->files_sent;
          } else {
            ++stats->files_unchanged;
            stats->bytes_unchanged += size;
          }
          rc->MadeProgress();
          return OkStatus();
        }
        if (sent_any) rc->MadeProgress();
        // DATA_LOSS for a short stream keeps the bytes, and FAILED_PRECONDITION means the agent holds
        // another offset: both resume from StatBlob like a dropped stream.
        if ((failure.code() == StatusCode::kDataLoss && offset < size) ||
            failure.code() == StatusCode::kFailedPrecondition) {
          failure = AbortedError(failure.message());
        }
      }
    }
    if (!rc->ShouldRetry(failure)) return rc->GiveUp(failure);
  }
}

}  // namespace sftctl::client
