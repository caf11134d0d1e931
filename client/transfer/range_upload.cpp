#include "client/transfer/range_upload.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "client/remote/connection_ramp.h"
#include "common/mutex.h"
#include "common/os/fd_util.h"
#include "common/os/file_system.h"

namespace sftctl::client {
namespace {

// What the workers share.
struct UploadShared {
  std::string path, sha256;
  uint64_t size = 0, block = 0;
  int fd = -1;
  Progress* progress = nullptr;

  Mutex mu;
  CondVar cv;                               // a worker ended
  std::vector<size_t> todo GUARDED_BY(mu);  // blocks to send, taken from the back
  Status error GUARDED_BY(mu);              // the first failure; stops everyone
  bool complete GUARDED_BY(mu) = false;     // the agent said the blob is complete
  std::atomic<uint64_t> sent{0};

  // The next block to send; false when none is left or someone failed.
  bool Take(size_t* b) EXCLUDES(mu) {
    MutexLock l(&mu);
    if (!error.ok() || todo.empty()) return false;
    *b = todo.back();
    todo.pop_back();
    return true;
  }
  void Fail(const Status& s) EXCLUDES(mu) {
    MutexLock l(&mu);
    if (error.ok()) error = s;
  }
  // Blocks are left for another worker to take.
  bool MoreToTake() EXCLUDES(mu) {
    MutexLock l(&mu);
    return error.ok() && !todo.empty();
  }
};

// Streams block `b` through `a`. *sent: its bytes that went out (for progress, also on a failure).
Status SendBlock(AgentSession& a, UploadShared& sh, size_t b, uint64_t* sent) {
  const uint64_t start = static_cast<uint64_t>(b) * sh.block, end = std::min(sh.size, start + sh.block);
  grpc::ClientContext ctx;
  a.Prepare(&ctx, std::chrono::milliseconds(0));
  v1::BlobStatus result;
  auto writer = a.stub()->UploadBlob(&ctx, &result);
  v1::UploadBlobRequest first;
  first.set_sha256(sh.sha256);
  first.set_size(sh.size);
  first.set_offset(start);
  first.set_length(end - start);
  first.set_block(sh.block);
  Status read_error;
  WriteBlobStream(
      &ctx, writer.get(), first, sh.fd, sh.path, start, end,
      [&](size_t n) {
        *sent += n;
        sh.sent += n;
        if (sh.progress) sh.progress->Add(n);
      },
      &read_error);
  grpc::Status fin = writer->Finish();
  SFT_RETURN_IF_ERROR(read_error);
  SFT_RETURN_IF_ERROR(
      FromGrpc(fin, a.host() + ": upload of block " + std::to_string(b) + " of '" + sh.path + "'"));
  if (result.complete()) {
    MutexLock l(&sh.mu);
    sh.complete = true;
  }
  return OkStatus();
}

// One connection's share: blocks until none is left, each resent whole after a reconnect.
void RunWorker(Reconnector* rc, UploadShared* sh) {
  size_t b;
  while (sh->Take(&b)) {
    Status s = rc->Run([&](AgentSession& a) {
      uint64_t sent = 0;
      Status sent_status = SendBlock(a, *sh, b, &sent);
      return Attempt{sent_status, false, sent > 0 || sent_status.ok()};
    });
    if (!s.ok()) return sh->Fail(s);
  }
}

// Runs workers until every block is sent or one failed: as many as `connections` > 0 says, else as the
// ramp chooses (one more while the last one added paid off, and blocks are left for it).
void RunWorkers(Reconnector* rc, UploadShared* sh, int connections, const Clock* clock) {
  ConnectionRamp ramp(connections, kMaxUploadConnections, clock);
  ConnectionSet set(rc);
  std::vector<std::thread> threads;
  std::atomic<int> running{0};
  const auto add = [&] {
    Reconnector* r = set.Add();
    ++running;
    threads.emplace_back([r, sh, &running] {
      RunWorker(r, sh);
      MutexLock l(&sh->mu);
      --running;
      sh->cv.NotifyAll();
    });
  };
  const int blocks = [&] {
    MutexLock l(&sh->mu);
    return static_cast<int>(sh->todo.size());
  }();
  while (set.size() < std::min(ramp.initial(), std::max(1, blocks))) add();
  ramp.Started(sh->sent.load());
  for (;;) {
    {
      MutexLock l(&sh->mu);
      if (sh->cv.WaitFor(&sh->mu, std::chrono::milliseconds(100), [&] { return running.load() == 0; })) break;
    }
    if (sh->MoreToTake() && ramp.ShouldAdd(sh->sent.load(), set.size())) add();
  }
  for (auto& t : threads) t.join();
  set.Fold();
}

}  // namespace

Status UploadRanges(Reconnector* rc, const std::string& local_path, uint64_t size, const std::string& sha256,
                    const v1::BlobStatus& held, const RangeUploadOptions& options, Progress* progress,
                    UploadStats* stats) {
  UploadShared sh;
  sh.path = local_path;
  sh.sha256 = sha256;
  sh.size = size;
  sh.block = std::max<uint64_t>(1, options.block_bytes);
  sh.progress = progress;
  const size_t blocks = static_cast<size_t>((size + sh.block - 1) / sh.block);
  std::vector<char> have(blocks, 0);
  if (held.block() == sh.block) {
    for (uint64_t b : held.blocks_held()) {
      if (b < blocks) have[b] = 1;
    }
  }
  std::vector<size_t> todo;
  for (size_t b = blocks; b-- > 0;) {  // taken from the back: block 0 first
    if (!have[b]) {
      todo.push_back(b);
    } else if (progress) {
      progress->Add(std::min(size, (b + 1) * sh.block) - b * sh.block);
    }
  }
  {
    MutexLock l(&sh.mu);  // no worker runs yet
    sh.todo = std::move(todo);
  }
  UniqueFd fd(::open(local_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoError("cannot read", local_path, errno);
  sh.fd = fd.get();
  RunWorkers(rc, &sh, options.connections, options.clock);
  fd.Close();
  stats->bytes_sent += sh.sent.load();
  bool complete = false;
  {
    MutexLock l(&sh.mu);  // every worker has ended
    SFT_RETURN_IF_ERROR(sh.error);
    complete = sh.complete;
  }
  if (!complete) {
    // Every block went out, yet no answer said complete (the completing one was lost with its stream,
    // or the blocks were all held already): ask.
    Status asked = WithRetry(rc, [&](AgentSession& a) {
      v1::StatBlobRequest req;
      req.set_sha256(sha256);
      v1::BlobStatus st;
      grpc::ClientContext ctx;
      a.Prepare(&ctx);
      SFT_RETURN_IF_ERROR(FromGrpc(a.stub()->StatBlob(&ctx, req, &st), a.host() + ": StatBlob"));
      complete = st.complete();
      return OkStatus();
    });
    SFT_RETURN_IF_ERROR(asked);
    if (!complete) {
      return DataLossError(rc->host() + ": upload of '" + local_path +
                           "' ended incomplete: the agent holds " + "not all of its blocks; send it again");
    }
  }
  if (sh.sent.load() > 0) {
    ++stats->files_sent;
  } else {
    ++stats->files_unchanged;
    stats->bytes_unchanged += size;
  }
  return OkStatus();
}

}  // namespace sftctl::client
