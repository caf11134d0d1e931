// BlobStore's ranged uploads (blob_store.h): blocks of one blob written at their place by several
// streams, recorded in a RangeLog, hashed in block order as they complete. Only a stream that is
// writing a block holds a descriptor of the partial file: the agent may know of many ranged uploads
// that clients started and abandoned, and they must not use up its descriptors. A recorded block is
// never written again (a resend is compared with it), so the running hash, read back from the file,
// stays the file's.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include "agent/state/blob_store.h"
#include "common/range_log.h"

namespace sftctl::agent {

struct BlobStore::Ranged {
  std::string sha;
  uint64_t size = 0, block = 0;
  size_t blocks = 0;
  std::unique_ptr<RangeLog> log;  // closed between appends

  Mutex mu;  // guards what follows
  // Per block: recorded / a stream is writing it.
  std::vector<char> done GUARDED_BY(mu), busy GUARDED_BY(mu);
  size_t hashed GUARDED_BY(mu) = 0;  // blocks [0, hashed) are in `hasher`
  std::unique_ptr<Sha256> hasher GUARDED_BY(mu) = std::make_unique<Sha256>();
  bool gone GUARDED_BY(mu) = false;  // completed or discarded: its files are no longer this upload's
  uint64_t Start(size_t b) const { return static_cast<uint64_t>(b) * block; }
  uint64_t End(size_t b) const { return std::min(size, Start(b) + block); }
};

std::string BlobStore::RangesPath(const std::string& sha256) const { return PartialPath(sha256) + ".ranges"; }

namespace {

// Blocks per ranged upload at most (each costs two bytes of memory): 8 TiB in 8 MiB blocks.
constexpr uint64_t kMaxRangeBlocks = 1 << 20;
// The partial file is read back (hashing, comparing a resent block) this much at a time, whatever the
// client's block size.
constexpr size_t kReadChunk = size_t{1} << 20;

// The size and block size a ranges log's header names ("sftctl-ranges 1 SIZE SHA BLOCK"); false when it
// is missing or names another blob.
bool ReadRangesHeader(const std::string& path, const std::string& sha256, uint64_t* size, uint64_t* block) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return false;
  std::istringstream h(line);
  std::string magic, version, sha;
  if (!(h >> magic >> version >> *size >> sha >> *block)) return false;
  return magic == "sftctl-ranges" && version == "1" && sha == sha256 && *block > 0 && *size > 0 &&
         (*size - 1) / *block < kMaxRangeBlocks;
}

}  // namespace

BlobStore::Stat BlobStore::RangedStat(Ranged& r) {
  Stat st;
  st.block = r.block;
  MutexLock l(&r.mu);
  for (size_t b = 0; b < r.blocks; ++b) {
    if (r.done[b]) st.blocks_held.push_back(b);
  }
  return st;
}

bool BlobStore::RangedBusy(Ranged& r) {
  MutexLock l(&r.mu);
  for (char b : r.busy) {
    if (b) return true;
  }
  return false;
}

void BlobStore::DiscardRanged(const std::string& sha256) {
  auto it = ranged_.find(sha256);
  if (it != ranged_.end()) {
    // Held here until the lock on its mutex is released: erasing the map's entry may destroy it.
    const std::shared_ptr<Ranged> r = std::move(it->second);
    ranged_.erase(it);
    MutexLock l(&r->mu);
    r->gone = true;
  }
  (void)::unlink(RangesPath(sha256).c_str());
  (void)::unlink(PartialPath(sha256).c_str());
}

StatusOr<std::shared_ptr<BlobStore::Ranged>> BlobStore::FindRanged(const std::string& sha256, uint64_t size,
                                                                   uint64_t block, bool create) {
  auto it = ranged_.find(sha256);
  std::shared_ptr<Ranged> r = it == ranged_.end() ? nullptr : it->second;
  uint64_t logged_size = 0, logged_block = 0;
  if (!r && ReadRangesHeader(RangesPath(sha256), sha256, &logged_size, &logged_block)) {
    r = std::make_shared<Ranged>();
    r->sha = sha256;
    r->size = logged_size;
    r->block = logged_block;
    r->blocks = static_cast<size_t>((logged_size + logged_block - 1) / logged_block);
    r->log = std::make_unique<RangeLog>(RangesPath(sha256), logged_size, sha256, logged_block);
    bool matched = false;
    {
      MutexLock l(&r->mu);  // not shared yet: nobody else can hold it
      r->done = r->log->Load(r->blocks, &matched);
      r->busy.assign(r->blocks, 0);
    }
    struct stat st;
    if (!matched || ::lstat(PartialPath(sha256).c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
        !r->log->Reopen().ok()) {
      r.reset();  // unreadable: start over below
      DiscardRanged(sha256);
    } else {
      r->log->Close();
      ranged_[sha256] = r;
    }
  }
  if (size == 0) return r;  // StatBlob: whatever there is
  if (r && (r->size != size || r->block != block) && RangedBusy(*r)) {
    return AbortedError("a ranged upload of blob " + sha256 + " with other blocks is in progress");
  }
  if (r && r->size == size && r->block == block) return r;
  if (r) DiscardRanged(sha256);
  if (!create) return std::shared_ptr<Ranged>();
  SFT_RETURN_IF_ERROR(CheckSpace(size));
  r = std::make_shared<Ranged>();
  r->sha = sha256;
  r->size = size;
  r->block = block;
  r->blocks = static_cast<size_t>((size + block - 1) / block);
  {
    MutexLock l(&r->mu);  // not shared yet
    r->done.assign(r->blocks, 0);
    r->busy.assign(r->blocks, 0);
  }
  const int fd =
      ::open(PartialPath(sha256).c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return ErrnoError("cannot write", PartialPath(sha256), errno);
  ::close(fd);
  r->log = std::make_unique<RangeLog>(RangesPath(sha256), size, sha256, block);
  SFT_RETURN_IF_ERROR(r->log->Start());
  r->log->Close();
  ranged_[sha256] = r;
  return r;
}

StatusOr<std::unique_ptr<BlobStore::RangeUpload>> BlobStore::BeginRange(const std::string& sha256,
                                                                        uint64_t size, uint64_t block,
                                                                        uint64_t offset, uint64_t length) {
  if (!IsSha256Hex(sha256)) return InvalidArgumentError("sha256: must be 64 lowercase hex digits");
  if (block == 0 || size == 0 || offset >= size || offset % block != 0 ||
      length != std::min(block, size - offset) || (size - 1) / block >= kMaxRangeBlocks) {
    return InvalidArgumentError("length: a range must be one whole block (offset " + std::to_string(offset) +
                                ", length " + std::to_string(length) + ", block " + std::to_string(block) +
                                ", size " + std::to_string(size) + ")");
  }
  MutexLock lock(&mu_);
  if (active_.count(sha256)) {
    return AbortedError("a sequential upload of blob " + sha256 + " is already in progress");
  }
  struct stat st;
  if (::stat(BlobPath(sha256).c_str(), &st) == 0) {
    return AlreadyExistsError("blob " + sha256 + " is already complete");
  }
  SFT_ASSIGN_OR_RETURN(std::shared_ptr<Ranged> r, FindRanged(sha256, size, block, /*create=*/true));
  const size_t b = static_cast<size_t>(offset / block);
  MutexLock l(&r->mu);
  if (r->busy[b])
    return AbortedError("block " + std::to_string(b) + " of blob " + sha256 + " is being uploaded");
  const bool verify = r->done[b] != 0;  // held already: the resend is compared, not written
  const int fd = ::open(PartialPath(sha256).c_str(), (verify ? O_RDONLY : O_RDWR) | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoError(verify ? "cannot read" : "cannot write", PartialPath(sha256), errno);
  r->busy[b] = 1;
  return std::unique_ptr<RangeUpload>(new RangeUpload(this, r, b, offset, offset + length, fd, verify));
}

BlobStore::RangeUpload::RangeUpload(BlobStore* owner, std::shared_ptr<Ranged> r, size_t block, uint64_t start,
                                    uint64_t end, int fd, bool verify)
    : owner_(owner),
      r_(std::move(r)),
      block_(block),
      start_(start),
      pos_(start),
      end_(end),
      fd_(fd),
      verify_(verify) {}

BlobStore::RangeUpload::~RangeUpload() {
  ::close(fd_);
  MutexLock l(&r_->mu);
  if (block_ < r_->busy.size()) r_->busy[block_] = 0;
}

Status BlobStore::RangeUpload::Write(const std::string& data) {
  if (finished_) return FailedPreconditionError("upload already finished");
  if (pos_ + data.size() > end_) {
    return InvalidArgumentError("data: more than the range's " + std::to_string(end_ - start_) + " bytes");
  }
  if (verify_) {
    SFT_RETURN_IF_ERROR(Compare(data));
  } else {
    SFT_RETURN_IF_ERROR(PwriteFully(fd_, data.data(), data.size(), pos_, owner_->PartialPath(r_->sha)));
  }
  pos_ += data.size();
  return OkStatus();
}

// A resent block: `data` must equal the bytes held at pos_ (read in chunks, whatever its size).
Status BlobStore::RangeUpload::Compare(const std::string& data) {
  std::string held(std::min(data.size(), kReadChunk), '\0');
  for (size_t done = 0; done < data.size();) {
    const size_t n = std::min(held.size(), data.size() - done);
    SFT_RETURN_IF_ERROR(PreadFully(fd_, held.data(), n, pos_ + done, owner_->PartialPath(r_->sha)));
    if (held.compare(0, n, data, done, n) != 0) {
      return FailedPreconditionError("data: block " + std::to_string(block_) + " of blob " + r_->sha +
                                     " is already held with other bytes (at offset " +
                                     std::to_string(pos_ + done) +
                                     "); a completed block cannot change: did the file change during "
                                     "the upload?");
    }
    done += n;
  }
  return OkStatus();
}

Status BlobStore::RangeUpload::Finish(bool* complete) {
  *complete = false;
  if (finished_) return FailedPreconditionError("upload already finished");
  finished_ = true;
  if (pos_ != end_) {
    return DataLossError("size: received " + std::to_string(pos_ - start_) + " of the " +
                         std::to_string(end_ - start_) + " bytes of block " + std::to_string(block_) +
                         " of blob " + r_->sha + "; send the block again");
  }
  if (!verify_ && ::fdatasync(fd_) != 0)
    return ErrnoError("cannot sync", owner_->PartialPath(r_->sha), errno);
  std::string digest;
  {
    MutexLock l(&r_->mu);
    if (r_->gone) return AbortedError("the upload of blob " + r_->sha + " was replaced meanwhile");
    if (!r_->done[block_]) SFT_RETURN_IF_ERROR(r_->log->Append(block_));
    r_->done[block_] = 1;
    SFT_RETURN_IF_ERROR(HashContiguous());
    if (r_->hashed < r_->blocks) return OkStatus();
    r_->gone = true;  // this stream stores it; nobody else touches its files from now on
    digest = r_->hasher->HexDigest();
  }
  return Store(digest, complete);
}

// Adds the blocks now contiguous from the start to the running hash, read back from the file in
// chunks (REQUIRES: r_->mu held). A block whose read fails is hashed by the next stream to finish.
Status BlobStore::RangeUpload::HashContiguous() {
  Ranged& r = *r_;
  r.mu.AssertHeld();  // the header cannot name r_->mu (Ranged is defined here)
  if (r.hashed >= r.blocks || !r.done[r.hashed]) return OkStatus();
  std::vector<char> buf(std::min<uint64_t>(kReadChunk, r.block));
  while (r.hashed < r.blocks && r.done[r.hashed]) {
    const uint64_t start = r.Start(r.hashed), end = r.End(r.hashed);
    for (uint64_t off = start; off < end;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), end - off));
      if (Status read = PreadFully(fd_, buf.data(), n, off, owner_->PartialPath(r.sha)); !read.ok()) {
        r.hasher = std::make_unique<Sha256>();  // part of a block is in it: start over from block 0
        r.hashed = 0;
        return read;
      }
      r.hasher->Update(buf.data(), n);
      off += n;
    }
    ++r.hashed;
  }
  return OkStatus();
}

// The whole has arrived and hashes to `digest`: renames it into place when that is its sha256,
// else deletes it.
Status BlobStore::RangeUpload::Store(const std::string& digest, bool* complete) {
  const Ranged& r = *r_;
  const std::string partial = owner_->PartialPath(r.sha);
  MutexLock store(&owner_->mu_);
  auto it = owner_->ranged_.find(r.sha);
  if (it != owner_->ranged_.end() && it->second == r_) owner_->ranged_.erase(it);
  // The digest is of bytes [0, size) as read back from the file; it must hold nothing more.
  struct stat st;
  const bool sized = ::fstat(fd_, &st) == 0 && static_cast<uint64_t>(st.st_size) == r.size;
  if (digest != r.sha || !sized) {
    (void)::unlink(owner_->RangesPath(r.sha).c_str());
    (void)::unlink(partial.c_str());
    if (!sized) {
      return DataLossError("size: the partial file of blob " + r.sha + " is not " + std::to_string(r.size) +
                           " bytes; nothing stored");
    }
    return DataLossError("sha256: uploaded blocks hash to " + digest + ", expected " + r.sha +
                         "; nothing stored");
  }
  SFT_RETURN_IF_ERROR(owner_->fs_->Rename(partial, owner_->BlobPath(r.sha)));
  (void)::unlink(owner_->RangesPath(r.sha).c_str());
  SFT_RETURN_IF_ERROR(owner_->fs_->SyncDir(owner_->dir_));
  SFT_RETURN_IF_ERROR(owner_->store_->PutBlob(r.sha, r.size));
  *complete = true;
  return OkStatus();
}

}  // namespace sftctl::agent
