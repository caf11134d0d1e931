// BlobStore: content-addressed files uploaded by clients (<data_dir>/blobs/<sha256>).
//
// Uploads are resumable: bytes land in blobs/partial/<sha256> and stay there if the client goes away;
// StatBlob tells how many bytes are held. A finished upload is hashed and only renamed into place
// when the digest matches; on mismatch the partial file is deleted, so nothing is stored.
//
// Ranged uploads: a large blob may come as fixed-size blocks over several streams at once, in any
// order (BeginRange). The blocks are written at their place in the same partial file as their chunks
// arrive; each completed block is synced and recorded in blobs/partial/<sha256>.ranges
// (common/range_log.h), so StatBlob lists the blocks held and a client resumes by sending the others,
// across agent restarts. A completed block is immutable: a stream that sends it again (a client whose
// answer was lost resends the block) has its bytes compared with the held ones and is answered OK when
// they are equal, FAILED_PRECONDITION (nothing written) when not. The blob is hashed in block order
// while later blocks still arrive, each block read back from the partial file in 1 MiB chunks, so the
// digest is that of the file's own bytes and a stream's memory is bounded by its chunk size; the
// block that completes it verifies the digest and the file's size and renames the blob into place (a
// mismatch deletes the partial file and its log).
//
// Sequential uploads are written, synced, read back and renamed through a FileSystem (tests inject a
// full disk); ranged blocks use pwrite/pread on one descriptor; the metadata calls of StatBlob, the
// free-space check and garbage collection use POSIX directly.
//
// Thread safety: safe for concurrent use; per sha256, one sequential upload or any number of ranged
// blocks (each block by one stream at a time) at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "agent/state/state_store.h"
#include "common/mutex.h"
#include "common/os/file_system.h"
#include "common/sha256.h"
#include "common/status.h"

namespace sftctl::agent {

class BlobStore {
 public:
  struct Stat {
    bool complete = false;
    uint64_t size = 0;   // complete: blob size; else bytes of the partial upload (0 for a ranged one)
    uint64_t block = 0;  // a ranged upload in progress: its block size ...
    std::vector<uint64_t> blocks_held;  // ... and the blocks it holds
  };
  struct Ranged;  // the shared state of one ranged upload

  // One upload in progress. Destroying it without Finish() keeps the partial bytes for a resume.
  class Upload {
   public:
    ~Upload();
    // All or nothing: a failed write (RESOURCE_EXHAUSTED on a full disk) is cut off the partial file,
    // so the same data can be written again. Should that fail too, the upload ends (FAILED_PRECONDITION
    // afterwards) and a new one resumes from the bytes held.
    Status Write(const std::string& data);
    // Verifies size and sha256; renames the blob into place. DATA_LOSS (and the partial file
    // deleted) on a short upload or a digest mismatch.
    Status Finish();
    uint64_t written() const { return pos_; }

   private:
    friend class BlobStore;
    Upload(BlobStore* owner, std::string sha, uint64_t size, uint64_t offset,
           std::unique_ptr<AppendableFile> file);
    StatusOr<std::string> HexDigest();
    BlobStore* owner_;
    std::string sha_;
    uint64_t size_;
    uint64_t pos_;
    std::unique_ptr<AppendableFile> file_;  // the partial file; null once finished
    bool released_ = false;
    std::unique_ptr<Sha256> hasher_;  // only when the upload started at offset 0
  };

  // One block of a ranged upload. Destroying it without Finish() leaves the block to be sent again.
  class RangeUpload {
   public:
    ~RangeUpload();
    // Writes `data` at its place. INVALID_ARGUMENT past the block's end. A block that was complete
    // when the stream began is not written: FAILED_PRECONDITION when `data` differs from its bytes.
    Status Write(const std::string& data);
    // Syncs and records the block. When it was the last one missing, the whole is verified and renamed
    // into place: *complete. DATA_LOSS for a short block (nothing recorded) or when the whole does not
    // hash to the sha256 or is not `size` bytes (the partial file and its log are deleted).
    Status Finish(bool* complete);
    uint64_t written() const { return pos_ - start_; }

   private:
    friend class BlobStore;
    RangeUpload(BlobStore* owner, std::shared_ptr<Ranged> r, size_t block, uint64_t start, uint64_t end,
                int fd, bool verify);
    Status Compare(const std::string& data);
    Status HashContiguous();
    Status Store(const std::string& digest, bool* complete);
    BlobStore* owner_;
    std::shared_ptr<Ranged> r_;
    size_t block_;
    uint64_t start_, pos_, end_;
    int fd_;  // this stream's own descriptor of the partial file (owned)
    // The block was complete when the stream began: its bytes are compared, never written.
    const bool verify_;
    bool finished_ = false;
  };

  // `dir` is created if missing. `fs` (not owned; must outlive the store) holds the uploaded bytes.
  BlobStore(std::string dir, StateStore* store, FileSystem* fs = FileSystem::Default())
      : dir_(std::move(dir)), store_(store), fs_(fs) {}
  Status Init();

  std::string BlobPath(const std::string& sha256) const;
  StatusOr<Stat> StatBlob(const std::string& sha256);
  // Starts (or resumes at `offset`) an upload of `size` bytes. Errors: INVALID_ARGUMENT (bad sha256,
  // offset > size); ALREADY_EXISTS (the blob is complete: nothing to upload); FAILED_PRECONDITION
  // (offset differs from the bytes held); ABORTED (another upload of this blob is in progress);
  // RESOURCE_EXHAUSTED (not enough disk space).
  StatusOr<std::unique_ptr<Upload>> BeginUpload(const std::string& sha256, uint64_t size, uint64_t offset);
  // Starts one block [offset, offset + length) of a ranged upload of `size` bytes in blocks of `block`.
  // A ranged upload of the same blob with another size or block size that no stream is writing is
  // discarded, as is a sequential partial upload. Errors: INVALID_ARGUMENT (bad sha256; offset not a
  // multiple of block, or length not min(block, size - offset)); ALREADY_EXISTS (the blob is complete);
  // ABORTED (a sequential upload of this blob, or a stream writing this block, is in progress);
  // RESOURCE_EXHAUSTED (not enough disk space). A block already held may be sent again (the stream
  // verifies it, see RangeUpload::Write).
  StatusOr<std::unique_ptr<RangeUpload>> BeginRange(const std::string& sha256, uint64_t size, uint64_t block,
                                                    uint64_t offset, uint64_t length);

  // Garbage collection (agent/state/gc.h). A blob's mtime is its last use: StatBlob of a complete blob
  // touches it. RemoveIfUnused removes the blob (`partial`: its partial upload) unless an upload of it
  // is in progress or it was used at or after `used_before_s` (seconds since the epoch). Errors:
  // FAILED_PRECONDITION (busy or used since; nothing removed), NOT_FOUND, INTERNAL.
  Status RemoveIfUnused(const std::string& sha256, bool partial, int64_t used_before_s);
  const std::string& dir() const { return dir_; }
  std::string PartialDir() const;

 private:
  std::string PartialPath(const std::string& sha256) const;
  std::string RangesPath(const std::string& sha256) const;
  void Release(const std::string& sha256) EXCLUDES(mu_);
  // The ranged upload of `sha256`: the one in memory, else the one its log describes; with size > 0,
  // one of that size and block size, discarding another that no stream is writing and creating it
  // when `create`. Null (OK) when there is none.
  StatusOr<std::shared_ptr<Ranged>> FindRanged(const std::string& sha256, uint64_t size, uint64_t block,
                                               bool create) REQUIRES(mu_);
  // Drops the ranged upload of `sha256` and deletes its files.
  void DiscardRanged(const std::string& sha256) REQUIRES(mu_);
  Status CheckSpace(uint64_t need) const;
  static Stat RangedStat(Ranged& r);
  static bool RangedBusy(Ranged& r);

  const std::string dir_;
  StateStore* store_;
  FileSystem* const fs_;
  Mutex mu_;                                      // taken before a Ranged's own mutex, never after
  std::set<std::string> active_ GUARDED_BY(mu_);  // sequential uploads in progress
  // Ranged uploads known since the start.
  std::map<std::string, std::shared_ptr<Ranged>> ranged_ GUARDED_BY(mu_);
};

}  // namespace sftctl::agent
