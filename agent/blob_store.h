// BlobStore: content-addressed files uploaded by clients (<data_dir>/blobs/<sha256>).
//
// Uploads are resumable: bytes land in blobs/partial/<sha256> and stay there if the client goes away;
// StatBlob tells how many bytes are held. A finished upload is hashed and only renamed into place
// when the digest matches; on mismatch the partial file is deleted, so nothing is stored.
//
// Uploaded bytes are written, synced, read back and renamed through a FileSystem (tests inject a full
// disk); the metadata calls of StatBlob, the free-space check and garbage collection use POSIX directly.
//
// Thread safety: safe for concurrent use; at most one upload per sha256 at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "agent/state_store.h"
#include "common/file_system.h"
#include "common/sha256.h"
#include "common/status.h"

namespace sftctl::agent {

class BlobStore {
 public:
  struct Stat {
    bool complete = false;
    uint64_t size = 0;  // complete: blob size; else bytes of the partial upload
  };

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

  // Garbage collection (agent/gc.h). A blob's mtime is its last use: StatBlob of a complete blob
  // touches it. RemoveIfUnused removes the blob (`partial`: its partial upload) unless an upload of it
  // is in progress or it was used at or after `used_before_s` (seconds since the epoch). Errors:
  // FAILED_PRECONDITION (busy or used since; nothing removed), NOT_FOUND, INTERNAL.
  Status RemoveIfUnused(const std::string& sha256, bool partial, int64_t used_before_s);
  const std::string& dir() const { return dir_; }
  std::string PartialDir() const;

 private:
  std::string PartialPath(const std::string& sha256) const;
  void Release(const std::string& sha256);

  const std::string dir_;
  StateStore* store_;
  FileSystem* const fs_;
  std::mutex mu_;
  std::set<std::string> active_;
};

}  // namespace sftctl::agent
