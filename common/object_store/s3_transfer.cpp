#include "common/object_store/s3_transfer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/os/fd_util.h"
#include "common/os/file_system.h"
#include "common/range_log.h"
#include "common/sha256.h"

namespace sftctl {

namespace {

// The work ParallelFor's threads take, one index at a time, and the first error.
struct WorkQueue {
  Mutex mu;
  Status first GUARDED_BY(mu);
  size_t next GUARDED_BY(mu) = 0;
};

// Runs work(i) for i in [0, n) on `parallel` threads; stops handing out work after the first error or
// a cancel, and returns that first error.
Status ParallelFor(size_t n, int parallel, const std::atomic<bool>* cancel,
                   const std::function<Status(size_t)>& work) {
  WorkQueue q;
  auto worker = [&] {
    for (;;) {
      size_t i;
      {
        MutexLock l(&q.mu);
        if (!q.first.ok() || q.next >= n) return;
        if (cancel != nullptr && cancel->load()) {
          q.first = CancelledError("transfer cancelled");
          return;
        }
        i = q.next++;
      }
      Status st = work(i);
      MutexLock l(&q.mu);
      if (!st.ok() && q.first.ok()) q.first = st;
    }
  };
  std::vector<std::thread> threads;
  const size_t count = std::min<size_t>(n, static_cast<size_t>(std::max(1, parallel)));
  for (size_t t = 1; t < count; ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
  MutexLock l(&q.mu);
  return q.first;
}

// What the workers of one transfer report: the bytes, into the caller's TransferStats, and for an
// upload each part's ETag.
struct WorkerResults {
  WorkerResults(TransferStats* s, size_t parts) : stats(s), etags(parts) {}
  Mutex mu;
  TransferStats* const stats PT_GUARDED_BY(mu);
  std::vector<std::string> etags GUARDED_BY(mu);
};

StatusOr<std::string> ReadAt(int fd, uint64_t offset, uint64_t length, const std::string& path) {
  std::string buf(length, '\0');
  const Status read = PreadFully(fd, buf.data(), length, offset, path);
  if (read.code() == StatusCode::kDataLoss)
    return DataLossError(path + ": shorter than expected (changed while uploading?)");
  SFT_RETURN_IF_ERROR(read);
  return buf;
}

// The parts of an unfinished upload of `key` that can be kept: {upload_id, part number -> etag}.
StatusOr<std::pair<std::string, std::vector<S3Part>>> UnfinishedUpload(const S3Client& s3,
                                                                       const std::string& bucket,
                                                                       const std::string& key) {
  SFT_ASSIGN_OR_RETURN(auto uploads, s3.ListMultipartUploads(bucket, key));
  for (const S3MultipartUpload& u : uploads) {
    if (u.key != key) continue;
    SFT_ASSIGN_OR_RETURN(auto parts, s3.ListParts(bucket, key, u.upload_id));
    return std::make_pair(u.upload_id, std::move(parts));
  }
  return std::make_pair(std::string(), std::vector<S3Part>());
}

}  // namespace

Status UploadFile(const S3Client& s3, const std::string& bucket, const std::string& key,
                  const std::string& path, const TransferOptions& opt, TransferStats* stats) {
  TransferStats local;
  TransferStats& st = stats != nullptr ? *stats : local;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat sb {};
  if (fd.get() < 0 || ::fstat(fd.get(), &sb) != 0) return ErrnoError("open", path, errno);
  const uint64_t size = static_cast<uint64_t>(sb.st_size);
  const uint64_t part = std::max(opt.part_size, TransferOptions::kMinPartSize);
  if (size <= part) {
    SFT_ASSIGN_OR_RETURN(std::string data, ReadAt(fd.get(), 0, size, path));
    st.parts = 1;
    SFT_RETURN_IF_ERROR(s3.PutObject(bucket, key, data));
    st.bytes_sent += size;
    return Status();
  }
  const size_t parts = static_cast<size_t>((size + part - 1) / part);
  st.parts = static_cast<int>(parts);
  SFT_ASSIGN_OR_RETURN(auto unfinished, UnfinishedUpload(s3, bucket, key));
  std::string upload_id = unfinished.first;
  std::vector<std::string> have(parts);
  for (const S3Part& p : unfinished.second)
    if (p.number >= 1 && static_cast<size_t>(p.number) <= parts) have[p.number - 1] = p.etag;
  if (upload_id.empty()) {
    SFT_ASSIGN_OR_RETURN(upload_id, s3.CreateMultipartUpload(bucket, key));
  }
  WorkerResults results(&st, parts);
  SFT_RETURN_IF_ERROR(ParallelFor(parts, opt.parallel, opt.cancel, [&](size_t i) -> Status {
    const uint64_t off = i * part, len = std::min(part, size - off);
    SFT_ASSIGN_OR_RETURN(std::string data, ReadAt(fd.get(), off, len, path));
    const bool keep = !have[i].empty() && have[i] == Md5Hex(data);
    std::string etag = have[i];
    if (!keep) {
      SFT_ASSIGN_OR_RETURN(etag, s3.UploadPart(bucket, key, upload_id, static_cast<int>(i + 1), data));
    }
    MutexLock l(&results.mu);
    results.etags[i] = etag;
    (keep ? results.stats->bytes_resumed : results.stats->bytes_sent) += len;
    return Status();
  }));
  std::vector<std::string> etags;
  {
    MutexLock l(&results.mu);  // (every worker has ended)
    etags = std::move(results.etags);
  }
  return s3.CompleteMultipartUpload(bucket, key, upload_id, etags);
}

Status DownloadFile(const S3Client& s3, const std::string& bucket, const std::string& key, uint64_t size,
                    const std::string& sha256, const std::string& dest, const TransferOptions& opt,
                    TransferStats* stats) {
  TransferStats local;
  TransferStats& st = stats != nullptr ? *stats : local;
  const std::string part_path = dest + ".part";
  SFT_ASSIGN_OR_RETURN(S3ObjectInfo head, s3.HeadObject(bucket, key));
  if (head.size != size)
    return DataLossError(S3ObjectName(bucket, key) + ": " + std::to_string(head.size) +
                         " bytes, the manifest says " + std::to_string(size));
  const uint64_t block = std::max(opt.part_size, TransferOptions::kMinPartSize);
  const size_t blocks = static_cast<size_t>((size + block - 1) / block);
  st.parts = static_cast<int>(std::max<size_t>(blocks, 1));
  RangeLog log(part_path + ".ranges", size, sha256, block);
  bool matched = false;
  std::vector<char> done = log.Load(blocks, &matched);
  // Not through a link planted at FILE.part (ELOOP), like its .ranges sidecar (common/range_log.h).
  UniqueFd fd(
      ::open(part_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (matched ? 0 : O_TRUNC), 0644));
  if (fd.get() < 0) return ErrnoError("open", part_path, errno);
  SFT_RETURN_IF_ERROR(matched ? log.Reopen() : log.Start());
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) return ErrnoError("truncate", part_path, errno);
  WorkerResults results(&st, 0);
  SFT_RETURN_IF_ERROR(ParallelFor(blocks, opt.parallel, opt.cancel, [&](size_t i) -> Status {
    const uint64_t off = i * block, len = std::min(block, size - off);
    if (done[i]) {
      MutexLock l(&results.mu);
      results.stats->bytes_resumed += len;
      return Status();
    }
    uint64_t at = off;
    Status io;
    const Status got = s3.GetRange(bucket, key, off, len, [&](std::string_view data) {
      io = PwriteFully(fd.get(), data.data(), data.size(), at, part_path);
      if (!io.ok()) return false;
      at += data.size();
      return true;
    });
    if (!io.ok()) return io;
    SFT_RETURN_IF_ERROR(got);
    SFT_RETURN_IF_ERROR(log.Append(i));
    MutexLock l(&results.mu);
    results.stats->bytes_sent += len;
    return Status();
  }));
  log.Close();
  SFT_ASSIGN_OR_RETURN(std::string digest, Sha256File(part_path));
  if (digest != sha256) {
    std::remove(part_path.c_str());
    std::remove((part_path + ".ranges").c_str());
    return DataLossError(S3ObjectName(bucket, key) + ": sha256 " + digest + ", the manifest says " + sha256);
  }
  if (::rename(part_path.c_str(), dest.c_str()) != 0) return ErrnoError("rename", dest, errno);
  std::remove((part_path + ".ranges").c_str());
  return Status();
}

}  // namespace sftctl
