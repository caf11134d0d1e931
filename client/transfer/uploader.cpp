#include "client/transfer/uploader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "client/transfer/range_upload.h"
#include "common/os/fd_util.h"
#include "common/os/file_system.h"

namespace sftctl::client {
namespace {

// What one file's upload has done so far, over all its attempts.
struct UploadState {
  UploadState(const std::string& path, uint64_t bytes, const std::string& digest, Progress* p, UploadStats* s)
      : local_path(path), size(bytes), sha256(digest), progress(p), stats(s) {}

  const std::string& local_path;
  uint64_t size;
  const std::string& sha256;
  Progress* progress;
  UploadStats* stats;
  bool counted_resume = false;  // the bytes the agent held were added to progress
  bool sent_any = false;        // this process sent bytes of the file
  bool ranged = false;          // a large file, none of it on the agent yet: UploadRanges sends it
  v1::BlobStatus held;          // what the agent held then (blocks of an earlier ranged upload)
};

// Counts the file as already held by the agent (nothing of it sent).
void CountUnchanged(UploadState& st) {
  ++st.stats->files_unchanged;
  st.stats->bytes_unchanged += st.size;
}

// Streams the file from `offset` to its end through one UploadBlob call. *result: the agent's answer;
// *read_error: a local failure (the stream was cancelled); *sent: bytes that went out.
Status StreamBlob(AgentSession& a, UploadState& st, int fd, uint64_t offset, v1::BlobStatus* result,
                  Status* read_error, uint64_t* sent) {
  grpc::ClientContext ctx;
  a.Prepare(&ctx, std::chrono::milliseconds(0));
  auto writer = a.stub()->UploadBlob(&ctx, result);
  v1::UploadBlobRequest msg;
  msg.set_sha256(st.sha256);
  msg.set_size(st.size);
  msg.set_offset(offset);
  offset = WriteBlobStream(
      &ctx, writer.get(), msg, fd, st.local_path, offset, st.size,
      [&](size_t n) {
        *sent += n;
        st.stats->bytes_sent += n;
        st.sent_any = true;
        if (st.progress) st.progress->Add(n);
      },
      read_error);
  grpc::Status fin = writer->Finish();
  Status s = FromGrpc(fin, a.host() + ": upload of '" + st.local_path + "'");
  // DATA_LOSS for a short stream keeps the bytes, and FAILED_PRECONDITION means the agent holds another
  // offset: both resume from StatBlob like a dropped stream.
  if ((s.code() == StatusCode::kDataLoss && offset < st.size) || s.code() == StatusCode::kFailedPrecondition)
    return AbortedError(s.message());
  return s;
}

// One try: asks what the agent holds, then sends the rest (or hands a large file to UploadRanges).
Attempt UploadOnce(AgentSession& a, UploadState& st) {
  v1::StatBlobRequest sreq;
  sreq.set_sha256(st.sha256);
  v1::BlobStatus held;
  grpc::ClientContext sctx;
  a.Prepare(&sctx);
  Status stat = FromGrpc(a.stub()->StatBlob(&sctx, sreq, &held), a.host() + ": StatBlob");
  if (!stat.ok()) return Attempt{stat};
  if (held.complete()) {
    if (!st.sent_any) CountUnchanged(st);
    if (st.progress && !st.counted_resume) st.progress->Add(st.size);
    return Attempt{OkStatus()};
  }
  // A large file goes as parallel blocks, unless a one-stream upload of it is under way there.
  if (st.size >= kMinRangeUploadBytes && held.size() == 0 && !st.sent_any) {
    st.ranged = true;
    st.held = held;
    return Attempt{OkStatus()};
  }
  const uint64_t offset = held.size() > st.size ? 0 : held.size();
  if (st.progress && !st.counted_resume && !st.sent_any) st.progress->Add(offset);
  st.counted_resume = true;
  UniqueFd fd(::open(st.local_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Attempt{ErrnoError("cannot read", st.local_path, errno), /*final=*/true};
  v1::BlobStatus result;
  Status read_error;
  uint64_t sent = 0;
  Status s = StreamBlob(a, st, fd.get(), offset, &result, &read_error, &sent);
  if (!read_error.ok()) return Attempt{read_error, /*final=*/true};
  if (!s.ok()) return Attempt{s, false, sent > 0};
  if (!result.complete()) {
    return Attempt{
        DataLossError(a.host() + ": upload of '" + st.local_path + "' ended incomplete (" +
                      std::to_string(result.size()) + " of " + std::to_string(st.size) + " bytes)"),
        /*final=*/true};
  }
  if (st.sent_any) {
    ++st.stats->files_sent;
  } else {
    CountUnchanged(st);
  }
  return Attempt{OkStatus(), false, /*progressed=*/true};
}

}  // namespace

Status UploadFile(Reconnector* rc, const std::string& local_path, uint64_t size, const std::string& sha256,
                  Progress* progress, UploadStats* stats) {
  UploadState st(local_path, size, sha256, progress, stats);
  SFT_RETURN_IF_ERROR(rc->Run([&](AgentSession& a) { return UploadOnce(a, st); }));
  if (!st.ranged) return OkStatus();
  return UploadRanges(rc, local_path, size, sha256, st.held, RangeUploadOptions{}, progress, stats);
}

}  // namespace sftctl::client
