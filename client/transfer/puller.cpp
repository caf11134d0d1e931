#include "client/transfer/puller.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "client/transfer/range_pull.h"
#include "common/os/fd_util.h"
#include "common/os/file_system.h"
#include "common/sha256.h"

namespace sftctl::client {
namespace {

uint64_t FileSize(const std::string& path, bool* exists) {
  struct stat st;
  *exists = ::stat(path.c_str(), &st) == 0;
  return *exists ? static_cast<uint64_t>(st.st_size) : 0;
}

// What the agent says of the file in a stream's first chunk.
struct Stream {
  std::string sha256;
  uint64_t total = 0;
};

// The most bytes the .part may hold: the listed size when the listing is verified (a sha256), else
// the size the stream declares (a file that grows, e.g. metrics.jsonl while the job runs), which must
// fit as the listed one did (CheckPullRoom). *checked: the largest size checked so far.
StatusOr<uint64_t> StreamCap(const PullItem& item, const Stream& stream, const std::string& part,
                             uint64_t* checked) {
  if (!item.sha256.empty()) return item.size;
  if (stream.total > *checked) {
    SFT_RETURN_IF_ERROR(CheckPullRoom(item.remote_path, stream.total, part));
    *checked = stream.total;
  }
  return stream.total;
}

// Appends one chunk at *offset, never past `cap`: DATA_LOSS when the agent sends more than it declared.
Status WriteChunk(const v1::ArtifactChunk& chunk, const PullItem& item, const std::string& host, uint64_t cap,
                  int fd, const std::string& part, uint64_t* offset, Sha256* hasher) {
  if (chunk.offset() != *offset) {
    return DataLossError(host + ": '" + item.remote_path + "' chunk at offset " +
                         std::to_string(chunk.offset()) + ", expected " + std::to_string(*offset));
  }
  const std::string& data = chunk.data();
  if (data.size() > cap - std::min(cap, *offset)) {
    return DataLossError(host + " sent more of '" + item.remote_path + "' than the " + std::to_string(cap) +
                         " bytes it declared; nothing past them was written");
  }
  SFT_RETURN_IF_ERROR(WriteFully(fd, data, part));
  hasher->Update(data);
  *offset += data.size();
  return OkStatus();
}

// Where a one-stream pull writes, and what it has reached.
struct StreamTarget {
  int fd;
  const std::string& part;
  uint64_t* offset;
  Sha256* hasher;
  Stream* stream;
  uint64_t* checked;  // the largest size whose room was checked (StreamCap)
};

// One PullArtifact stream from *t.offset on. Final when writing here failed or the agent broke the
// stream's rules; *restart when the agent says the .part is longer than the file now.
Attempt StreamOnce(AgentSession& a, const std::string& job_id, const PullItem& item, const StreamTarget& t,
                   Progress* progress, PullStats* stats, bool* restart) {
  Attempt attempt;
  v1::PullArtifactRequest req;
  req.set_job_id(job_id);
  req.set_path(item.remote_path);
  req.set_offset(*t.offset);
  grpc::ClientContext ctx;
  a.Prepare(&ctx, std::chrono::milliseconds(0));
  auto reader = a.stub()->PullArtifact(&ctx, req);
  v1::ArtifactChunk chunk;
  bool first = true;
  uint64_t cap = 0;
  Status local;
  while (reader->Read(&chunk)) {
    if (first) {
      first = false;
      if (!chunk.sha256().empty()) t.stream->sha256 = chunk.sha256();
      t.stream->total = chunk.total_size();
      auto c = StreamCap(item, *t.stream, t.part, t.checked);
      local = c.status();
      if (c.ok()) cap = *c;
    }
    const uint64_t before = *t.offset;
    if (local.ok()) local = WriteChunk(chunk, item, a.host(), cap, t.fd, t.part, t.offset, t.hasher);
    if (!local.ok()) {
      ctx.TryCancel();
      break;
    }
    stats->bytes_fetched += *t.offset - before;
    attempt.progressed |= *t.offset > before;
    if (progress) progress->Add(*t.offset - before);
  }
  grpc::Status fin = reader->Finish();
  if (!local.ok()) return Attempt{local, /*final=*/true, attempt.progressed};
  attempt.status = FromGrpc(fin, a.host() + ": pull of '" + item.remote_path + "'");
  if (attempt.status.code() == StatusCode::kOutOfRange) {  // the .part is longer than the file now
    *restart = true;
    attempt.status = OkStatus();
  }
  return attempt;
}

// Streams from *offset to the end into `fd`, reconnecting and resuming from the offset reached, never
// past the size declared for the file (StreamCap). Returns true when the agent says the .part is
// longer than the file now (start over).
StatusOr<bool> StreamToEnd(Reconnector* rc, const std::string& job_id, const PullItem& item, int fd,
                           const std::string& part, uint64_t* offset, Sha256* hasher, Stream* stream,
                           Progress* progress, PullStats* stats) {
  uint64_t checked = item.size;  // PullFile checked room for the listed size
  const StreamTarget target{fd, part, offset, hasher, stream, &checked};
  bool restart = false;
  SFT_RETURN_IF_ERROR(rc->Run(
      [&](AgentSession& a) { return StreamOnce(a, job_id, item, target, progress, stats, &restart); }));
  return restart;
}

// The one-stream path: appends to "<dest>.part" from its size (PullArtifact offset), resuming a
// dropped stream, then fsyncs it and checks it against the sha256 the agent sent. A resumed .part
// that does not verify is discarded and fetched once more from the start.
Status FetchSequential(Reconnector* rc, const std::string& job_id, const PullItem& item,
                       const std::string& part, Progress* progress, PullStats* stats) {
  FileSystem* fs = FileSystem::Default();
  bool fresh_done = false;
  for (;;) {
    bool part_exists = false;
    uint64_t offset = FileSize(part, &part_exists);
    if (item.size > 0 && offset > item.size && !item.sha256.empty()) {
      SFT_RETURN_IF_ERROR(fs->RemoveAll(part));
      offset = 0;
    }
    const bool resumed = offset > 0;
    UniqueFd out(::open(part.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!out.valid()) return ErrnoError("cannot write", part, errno);
    Sha256 hasher;
    if (offset > 0) SFT_RETURN_IF_ERROR(Sha256UpdateFromFile(out.get(), offset, part, &hasher));
    if (progress) progress->Add(offset);
    if (::ftruncate(out.get(), static_cast<off_t>(offset)) != 0)
      return ErrnoError("cannot truncate", part, errno);

    Stream stream{item.sha256, item.size};
    StatusOr<bool> streamed =
        StreamToEnd(rc, job_id, item, out.get(), part, &offset, &hasher, &stream, progress, stats);
    if (streamed.status().code() == StatusCode::kDataLoss) {
      out.Close();  // the agent broke the stream's rules: keep nothing of it
      Status removed = fs->RemoveAll(part);
      (void)removed;  // the stream's error is the one to report
    }
    SFT_ASSIGN_OR_RETURN(bool restart_from_zero, std::move(streamed));
    if (restart_from_zero) {
      out.Close();
      SFT_RETURN_IF_ERROR(fs->RemoveAll(part));
      if (fresh_done)
        return DataLossError("'" + item.remote_path + "' keeps changing on the host; pull it again later");
      fresh_done = true;
      continue;
    }
    if (::fsync(out.get()) != 0) return ErrnoError("cannot sync", part, errno);
    if (out.Close() != 0) return ErrnoError("cannot close", part, errno);
    const std::string got = hasher.HexDigest();
    if (offset != stream.total || (!stream.sha256.empty() && got != stream.sha256)) {
      SFT_RETURN_IF_ERROR(fs->RemoveAll(part));
      if (resumed && !fresh_done) {
        fresh_done = true;  // the kept .part was stale or damaged: fetch it whole once
        continue;
      }
      return DataLossError(
          "'" + item.remote_path + "' does not verify after download: " + std::to_string(offset) + " of " +
          std::to_string(stream.total) + " bytes, sha256 " + got + ", expected " + stream.sha256);
    }
    return OkStatus();
  }
}

// Byte ranges over several connections (range_pull.h); a resumed .part that does not verify is
// fetched once more from the start.
Status FetchRanges(Reconnector* rc, const std::string& job_id, const PullItem& item, const std::string& part,
                   int streams, Progress* progress, PullStats* stats) {
  for (bool fresh = false;; fresh = true) {
    RangePullResult r;
    RangePullOptions options;
    options.max_streams = streams;
    Status s = PullRanges(rc, job_id, item.remote_path, item.size, item.sha256, part, options, progress, &r);
    stats->bytes_fetched += r.bytes_fetched;
    stats->streams = std::max(stats->streams, r.streams);
    if (s.ok() || !r.digest_mismatch || !r.resumed || fresh) return s;
  }
}

}  // namespace

Status PullFile(Reconnector* rc, const std::string& job_id, const PullItem& item, bool force,
                Progress* progress, PullStats* stats, int streams) {
  const std::string& dest = item.local_path;
  bool dest_exists = false;
  FileSize(dest, &dest_exists);
  if (dest_exists) {
    SFT_ASSIGN_OR_RETURN(std::string have, Sha256File(dest));
    if (!item.sha256.empty() && have == item.sha256) {
      ++stats->files_skipped;
      stats->bytes_skipped += item.size;
      if (progress) progress->Add(item.size);
      return OkStatus();
    }
    if (!force) {
      return AlreadyExistsError(
          "'" + dest + "' already exists and differs from the job's '" + item.remote_path + "' (sha256 " +
          have.substr(0, 12) + "... here, " +
          (item.sha256.empty() ? std::string("unknown") : item.sha256.substr(0, 12) + "...") +
          " on the host); move it away or pass --force to replace it");
    }
  }
  const std::string part = dest + ".part";
  SFT_RETURN_IF_ERROR(CheckPullRoom(item.remote_path, item.size, part));
  const std::string parent = std::filesystem::path(dest).parent_path().string();
  FileSystem* fs = FileSystem::Default();
  if (!parent.empty()) SFT_RETURN_IF_ERROR(fs->CreateDirs(parent));
  const bool ranges = !item.sha256.empty() && item.size >= kMinRangePullBytes;
  SFT_RETURN_IF_ERROR(ranges ? FetchRanges(rc, job_id, item, part, streams, progress, stats)
                             : FetchSequential(rc, job_id, item, part, progress, stats));
  SFT_RETURN_IF_ERROR(fs->Rename(part, dest));
  if (!parent.empty()) SFT_RETURN_IF_ERROR(fs->SyncDir(parent));
  ++stats->files_fetched;
  rc->MadeProgress();
  return OkStatus();
}

}  // namespace sftctl::client
