#include "client/transfer/range_pull.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <memory>
#include <thread>
#include <vector>

#include "client/remote/connection_ramp.h"
#include "common/mutex.h"
#include "common/os/fd_util.h"
#include "common/os/file_system.h"
#include "common/range_log.h"
#include "common/sha256.h"

namespace sftctl::client {
namespace {

// What the workers and the hashing thread share.
struct Shared {
  std::string job_id, remote_path, sha256, part;
  uint64_t size = 0;
  uint64_t block = kRangeBlockBytes;
  size_t blocks = 0;
  size_t window = 0;  // how far past the hash a worker may fetch
  int fd = -1;        // the .part, written with pwrite
  RangeLog* log = nullptr;

  Mutex mu;
  CondVar cv;
  std::vector<char> done GUARDED_BY(mu), taken GUARDED_BY(mu);  // per block
  size_t hashed GUARDED_BY(mu) = 0;                             // blocks [0, hashed) are in the digest
  Status error GUARDED_BY(mu);                                  // the first failure; stops everyone
  std::atomic<uint64_t> received{0};

  uint64_t BlockStart(size_t b) const { return static_cast<uint64_t>(b) * block; }
  uint64_t BlockEnd(size_t b) const { return std::min(size, BlockStart(b) + block); }
  void Fail(const Status& s) EXCLUDES(mu) {
    MutexLock l(&mu);
    if (error.ok()) error = s;
    cv.NotifyAll();
  }
};

// What TryTakeBlock returns when it has no block for the caller.
constexpr size_t kNoneNow = SIZE_MAX - 1;  // the window is full: the hash is behind
constexpr size_t kNoneEver = SIZE_MAX;     // every block is taken or done, or the pull failed

// The next block nobody has, within the window, without waiting.
size_t TryTakeBlock(Shared& sh) EXCLUDES(sh.mu) {
  MutexLock l(&sh.mu);
  if (!sh.error.ok()) return kNoneEver;
  size_t b = sh.hashed;
  while (b < sh.blocks && (sh.done[b] || sh.taken[b])) ++b;
  if (b >= sh.blocks) return kNoneEver;
  if (b >= sh.hashed + sh.window) return kNoneNow;
  sh.taken[b] = 1;
  return b;
}

// One range stream of a connection: the block it holds, the byte it reached, the call in flight.
struct Lane {
  size_t block = kNoneEver;  // kNoneEver: idle
  uint64_t pos = 0, end = 0;
  bool first = true;
  std::unique_ptr<grpc::ClientContext> ctx;
  std::unique_ptr<grpc::ClientAsyncReaderInterface<v1::ArtifactChunk>> reader;
  v1::ArtifactChunk chunk;
  grpc::Status fin;
  Status local;  // a failure found here that ended the stream
};

enum Op : uintptr_t { kStarted = 1, kRead = 2, kFinished = 3 };
void* Tag(size_t lane, Op op) { return reinterpret_cast<void*>((lane << 2) | op); }

// Checks one chunk against the range and writes it at its place; advances l.pos.
Status AcceptChunk(Shared& sh, Lane& l, const std::string& host) {
  const v1::ArtifactChunk& c = l.chunk;
  if (l.first && (c.total_size() != sh.size || (!c.sha256().empty() && c.sha256() != sh.sha256))) {
    return DataLossError("'" + sh.remote_path + "' changed on " + host + " while it was pulled (now " +
                         std::to_string(c.total_size()) + " bytes); pull it again");
  }
  l.first = false;
  if (c.offset() != l.pos) {
    return DataLossError(host + ": '" + sh.remote_path + "' chunk at offset " + std::to_string(c.offset()) +
                         ", expected " + std::to_string(l.pos));
  }
  // An agent that predates ranges sends to the end of the file: keep only this range.
  size_t n = static_cast<size_t>(std::min<uint64_t>(c.data().size(), l.end - l.pos));
  SFT_RETURN_IF_ERROR(PwriteFully(sh.fd, c.data().data(), n, l.pos, sh.part));
  l.pos += n;
  sh.received += n;
  return OkStatus();
}

// Streams ranges through one session, one gRPC stream per lane, all driven by one completion queue
// on the calling thread. Each stream is granted its own HTTP/2 window, so lanes add to what one
// connection moves per round trip. Lanes that hold a block from before (a dropped connection) resume
// it from the byte they reached; idle lanes take new blocks. After a lane's stream fails, no new
// stream starts and the others run to their end (all are cancelled when the file changed, writing
// here failed or another connection failed the pull).
class LaneSet {
 public:
  LaneSet(AgentSession& a, Shared& sh, std::vector<Lane>& lanes) : a_(a), sh_(sh), lanes_(lanes) {}

  // The first failure (OK: no block is left for this connection). *progressed: bytes arrived.
  Status Run(bool* progressed) {
    Fill();
    while (in_flight_ > 0 || (failure_.ok() && more_)) {
      if (in_flight_ == 0) {
        WaitForWindow();
        continue;
      }
      void* tag = nullptr;
      bool ok = false;
      auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(100);
      if (cq_.AsyncNext(&tag, &ok, deadline) != grpc::CompletionQueue::GOT_EVENT) {
        MutexLock l(&sh_.mu);
        if (!sh_.error.ok() && failure_.ok()) Stop(sh_.error);
        continue;
      }
      const auto bits = reinterpret_cast<uintptr_t>(tag);
      OnEvent(bits >> 2, static_cast<Op>(bits & 3), ok);
    }
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
    *progressed = progressed_;
    return failure_;
  }

 private:
  // Starts lane i's stream: the rest of its block, or a new block when it has none (and one is free).
  void Start(size_t i) {
    Lane& l = lanes_[i];
    if (l.block == kNoneEver) {
      size_t b = TryTakeBlock(sh_);
      if (b == kNoneEver) more_ = false;
      if (b >= kNoneNow) return;
      l.block = b;
      l.pos = sh_.BlockStart(b);
      l.end = sh_.BlockEnd(b);
    }
    v1::PullArtifactRequest req;
    req.set_job_id(sh_.job_id);
    req.set_path(sh_.remote_path);
    req.set_offset(l.pos);
    req.set_length(l.end - l.pos);
    l.ctx = std::make_unique<grpc::ClientContext>();
    a_.Prepare(l.ctx.get(), std::chrono::milliseconds(0));
    l.first = true;
    l.local = OkStatus();
    l.reader = a_.stub()->AsyncPullArtifact(l.ctx.get(), req, &cq_, Tag(i, kStarted));
    ++in_flight_;
  }
  void Fill() {
    for (size_t i = 0; i < lanes_.size() && failure_.ok(); ++i) {
      if (!lanes_[i].reader && (more_ || lanes_[i].block != kNoneEver)) Start(i);
    }
  }
  // Records `why` and cancels every stream in flight.
  void Stop(const Status& why) {
    if (failure_.ok()) failure_ = why;
    for (Lane& l : lanes_) {
      if (l.reader) l.ctx->TryCancel();
    }
  }
  // No stream in flight and none may start: the window is full until the hash moves on.
  void WaitForWindow() {
    {
      MutexLock l(&sh_.mu);
      sh_.cv.WaitFor(&sh_.mu, std::chrono::milliseconds(100));
      if (!sh_.error.ok()) failure_ = sh_.error;
    }
    Fill();
  }
  void OnEvent(size_t i, Op op, bool ok) {
    Lane& l = lanes_[i];
    if (op == kFinished) return OnFinished(i);
    if (op == kRead && ok && l.local.ok()) {
      const uint64_t before = l.pos;
      l.local = AcceptChunk(sh_, l, a_.host());
      progressed_ |= l.pos > before;
      if (l.local.ok() && l.pos < l.end) return l.reader->Read(&l.chunk, Tag(i, kRead));
      l.ctx->TryCancel();  // the range is complete (or failed here): end the stream
    } else if (op == kStarted && ok) {
      return l.reader->Read(&l.chunk, Tag(i, kRead));
    }
    l.reader->Finish(&l.fin, Tag(i, kFinished));
  }
  void OnFinished(size_t i) {
    Lane& l = lanes_[i];
    --in_flight_;
    l.reader.reset();
    if (l.local.ok() && l.pos >= l.end) {
      if (Status s = sh_.log->Append(l.block); !s.ok()) return Stop(s);
      MutexLock g(&sh_.mu);
      sh_.done[l.block] = 1;
      l.block = kNoneEver;
      sh_.cv.NotifyAll();
    } else if (!l.local.ok()) {
      Stop(l.local);  // the file changed on the host, or writing here failed
    } else if (failure_.ok()) {
      failure_ = l.fin.ok()
                     ? UnavailableError(a_.host() + ": the stream of '" + sh_.remote_path + "' ended early")
                     : FromGrpc(l.fin, a_.host() + ": pull of '" + sh_.remote_path + "'");
    }
    Fill();
  }

  AgentSession& a_;
  Shared& sh_;
  std::vector<Lane>& lanes_;
  grpc::CompletionQueue cq_;
  int in_flight_ = 0;
  bool more_ = true;  // blocks may still come
  bool progressed_ = false;
  Status failure_;
};

// One connection's share of the pull: `lanes` range streams at once through `rc`'s session,
// reconnecting after a failure and resuming each lane's block from the byte it reached.
void RunConnection(Reconnector* rc, Shared* sh, int lanes) {
  std::vector<Lane> lane(static_cast<size_t>(lanes));
  Status s = rc->Run([&](AgentSession& a) {
    Attempt attempt;
    attempt.status = LaneSet(a, *sh, lane).Run(&attempt.progressed);  // OK: no block left for this one
    if (attempt.status.code() == StatusCode::kDataLoss) attempt.final = true;
    MutexLock l(&sh->mu);
    if (!sh->error.ok()) attempt.final = true;  // someone else failed: stop
    return attempt;
  });
  if (!s.ok()) sh->Fail(s);
}

// The workers, started one at a time as the ramp (client/remote/connection_ramp.h) asks.
class Workers {
 public:
  Workers(Reconnector* first, Shared* sh, int max_streams, int lanes, const Clock* clock)
      : connections_(first),
        sh_(sh),
        lanes_(std::max(1, lanes)),
        ramp_(max_streams, kMaxAutoStreams, clock) {}
  ~Workers() { Join(); }
  void Start() {
    while (count() < ramp_.initial()) Add();
    ramp_.Started(sh_->received.load());
  }
  // Called about every 250 ms: adds a connection when the ramp says so.
  void MaybeRamp() {
    if (ramp_.ShouldAdd(sh_->received.load(), count())) Add();
  }
  void Join() {
    for (auto& t : threads_) t.join();
    threads_.clear();
    connections_.Fold();
  }
  // Workers started (joined ones included).
  int count() const { return connections_.size(); }

 private:
  void Add() { threads_.emplace_back(RunConnection, connections_.Add(), sh_, lanes_); }
  ConnectionSet connections_;
  Shared* sh_;
  int lanes_;
  ConnectionRamp ramp_;
  std::vector<std::thread> threads_;
};

// Hashes blocks in file order as they complete; returns the first failure of anyone.
Status HashInOrder(Shared& sh, Workers& workers, Sha256* hasher, Progress* progress) {
  std::string buf;
  uint64_t shown = 0;
  for (;;) {
    size_t b;
    bool ready;
    {
      MutexLock l(&sh.mu);
      sh.cv.WaitFor(&sh.mu, std::chrono::milliseconds(250), [&]() REQUIRES(sh.mu) {
        return !sh.error.ok() || sh.hashed >= sh.blocks || sh.done[sh.hashed];
      });
      if (!sh.error.ok()) return sh.error;
      if (sh.hashed >= sh.blocks) return OkStatus();
      b = sh.hashed;  // only this thread advances `hashed`
      ready = sh.done[b] != 0;
    }
    if (progress) {
      uint64_t now = sh.received.load();
      progress->Add(now - shown);
      shown = now;
    }
    workers.MaybeRamp();
    if (!ready) continue;
    uint64_t start = sh.BlockStart(b), len = sh.BlockEnd(b) - start;
    buf.resize(len);
    SFT_RETURN_IF_ERROR(PreadFully(sh.fd, buf.data(), len, start, sh.part));
    hasher->Update(buf);
    MutexLock l(&sh.mu);
    ++sh.hashed;
    sh.cv.NotifyAll();
  }
}

// Which blocks of an earlier run can be kept: those its .ranges lists (same size and sha256), or the
// complete blocks of a .part a one-stream pull left. Anything else starts over. Leaves `log` open.
StatusOr<std::vector<char>> ResumableBlocks(RangeLog& log, const std::string& part, uint64_t size,
                                            uint64_t block, size_t blocks) {
  FileSystem* fs = FileSystem::Default();
  struct stat st;
  const uint64_t have = ::stat(part.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  bool matched = false;
  std::vector<char> done = log.Load(blocks, &matched);
  if (matched) {
    for (size_t b = 0; b < blocks; ++b) {
      if (std::min(size, static_cast<uint64_t>(b + 1) * block) > have) done[b] = 0;
    }
    SFT_RETURN_IF_ERROR(log.Reopen());
    return done;
  }
  struct stat ls;
  const bool foreign_log = ::stat((part + ".ranges").c_str(), &ls) == 0;
  if (foreign_log || have > size) {
    SFT_RETURN_IF_ERROR(fs->RemoveAll(part));  // another file's ranges: nothing here is ours
  } else {
    for (size_t b = 0; b < blocks && static_cast<uint64_t>(b + 1) * block <= have; ++b) done[b] = 1;
  }
  SFT_RETURN_IF_ERROR(log.Start());
  for (size_t b = 0; b < blocks; ++b) {
    if (done[b]) SFT_RETURN_IF_ERROR(log.Append(b));
  }
  return done;
}

// Ends a range pull: the .part must be whole and hash to `sha256`; then it is fsynced and the
// sidecar removed. On a mismatch both are removed.
Status FinishPart(int fd, const Shared& sh, const std::string& digest, RangePullResult* result) {
  FileSystem* fs = FileSystem::Default();
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("cannot stat", sh.part, errno);
  if (static_cast<uint64_t>(st.st_size) != sh.size || digest != sh.sha256) {
    SFT_RETURN_IF_ERROR(fs->RemoveAll(sh.part));
    SFT_RETURN_IF_ERROR(fs->RemoveAll(sh.part + ".ranges"));
    result->digest_mismatch = true;
    return DataLossError("'" + sh.remote_path +
                         "' does not verify after download: " + std::to_string(st.st_size) + " of " +
                         std::to_string(sh.size) + " bytes, sha256 " + digest + ", expected " + sh.sha256);
  }
  if (::fsync(fd) != 0) return ErrnoError("cannot sync", sh.part, errno);
  return fs->RemoveAll(sh.part + ".ranges");
}

// Bytes free to this user in the nearest existing folder of `path`.
StatusOr<uint64_t> FreeBytesNear(const std::string& path) {
  std::string dir = path;
  for (;;) {
    const size_t slash = dir.find_last_of('/');
    dir = slash == std::string::npos ? "." : slash == 0 ? "/" : dir.substr(0, slash);
    struct statvfs vfs;
    if (::statvfs(dir.c_str(), &vfs) == 0)
      return static_cast<uint64_t>(vfs.f_bavail) * static_cast<uint64_t>(vfs.f_frsize);
    if (errno != ENOENT || dir == "/" || dir == ".")
      return ErrnoError("cannot check the free space of", dir, errno);
  }
}

}  // namespace

Status CheckPullRoom(const std::string& remote_path, uint64_t size, const std::string& part) {
  if (size > kMaxPullBytes) {
    return ResourceExhaustedError("'" + remote_path + "' is listed at " + std::to_string(size) +
                                  " bytes, more than sftctl pulls (" + std::to_string(kMaxPullBytes >> 40) +
                                  " TiB); nothing was fetched");
  }
  struct stat st;  // what the .part holds on disk (a range pull's may be sparse)
  const uint64_t have = ::stat(part.c_str(), &st) == 0 ? std::min(static_cast<uint64_t>(st.st_size),
                                                                  static_cast<uint64_t>(st.st_blocks) * 512)
                                                       : 0;
  if (have >= size) return OkStatus();
  SFT_ASSIGN_OR_RETURN(uint64_t free, FreeBytesNear(part));
  if (size - have > free) {
    const std::string dir = part.substr(0, part.find_last_of('/') + 1);
    return ResourceExhaustedError("'" + remote_path + "' needs " + FormatBytes(size - have) +
                                  " more but only " + FormatBytes(free) + " are free in " +
                                  (dir.empty() ? "." : dir) + "; nothing was fetched");
  }
  return OkStatus();
}

Status PullRanges(Reconnector* rc, const std::string& job_id, const std::string& remote_path, uint64_t size,
                  const std::string& sha256, const std::string& part, const RangePullOptions& options,
                  Progress* progress, RangePullResult* result) {
  SFT_RETURN_IF_ERROR(CheckPullRoom(remote_path, size, part));  // before size/block entries exist
  const int max_streams = options.max_streams;
  Shared sh;
  sh.job_id = job_id;
  sh.remote_path = remote_path;
  sh.sha256 = sha256;
  sh.part = part;
  sh.size = size;
  sh.block = std::max<uint64_t>(1, options.block_bytes);
  sh.blocks = static_cast<size_t>((size + sh.block - 1) / sh.block);
  // Room for every lane of every connection, twice over, ahead of the hash.
  sh.window = 2 * static_cast<size_t>(std::max(1, options.lanes)) *
              static_cast<size_t>(max_streams > 0 ? max_streams : kMaxAutoStreams);
  RangeLog log(part + ".ranges", size, sha256, sh.block);
  sh.log = &log;
  SFT_ASSIGN_OR_RETURN(std::vector<char> done, ResumableBlocks(log, part, size, sh.block, sh.blocks));
  for (size_t b = 0; b < sh.blocks; ++b) {
    if (!done[b]) continue;
    result->resumed = true;
    if (progress) progress->Add(sh.BlockEnd(b) - sh.BlockStart(b));
  }
  {
    MutexLock l(&sh.mu);  // no worker runs yet
    sh.done = std::move(done);
    sh.taken.assign(sh.blocks, 0);
  }
  UniqueFd part_fd(::open(part.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!part_fd.valid()) return ErrnoError("cannot write", part, errno);
  sh.fd = part_fd.get();
  Sha256 hasher;
  Status s;
  {
    Workers workers(rc, &sh, max_streams, options.lanes, options.clock);
    workers.Start();
    s = HashInOrder(sh, workers, &hasher, progress);
    if (!s.ok()) sh.Fail(s);  // stops the workers
    workers.Join();
    result->streams = workers.count();
  }
  result->bytes_fetched = sh.received.load();
  if (s.ok()) s = FinishPart(sh.fd, sh, hasher.HexDigest(), result);
  return s;
}

}  // namespace sftctl::client
