// FileSystem: the small seam through which sftctl touches files.
//
// Modelled on leveldb::Env. Production code uses FileSystem::Default() (POSIX); tests wrap
// it (see tests/common/fault_file_system.h) to inject faults such as a write that fails
// half-way or a crash before a rename, so crash-safety can be tested deterministically.
//
// Thread safety: FileSystem implementations are safe for concurrent use. A WritableFile
// is used by one thread at a time; an AppendableFile also serves ReadAt from other threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace sftctl {

// An open file being written sequentially. Close() must be called; the destructor closes
// silently (dropping errors) if it was not.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status Append(std::string_view data) = 0;
  // Flushes to the device (fsync).
  virtual Status Sync() = 0;
  virtual Status Close() = 0;
};

// An open file that keeps its content, is appended to at its end and read back at offsets: an
// append-only log (agent/state/journal.h) or a resumable upload (agent/state/blob_store.h). Append writes at the
// end of the file (O_APPEND), also after Truncate. Close() must be called; the destructor closes
// silently (dropping errors) if it was not.
//
// Thread safety: Append, Sync, Truncate, Size and Close are used by one thread at a time. ReadAt may
// run concurrently with them (except Close) and with other ReadAt calls.
class AppendableFile : public WritableFile {
 public:
  // Reads up to `n` bytes starting at `offset` into `scratch` (REQUIRES: room for `n` bytes; owned
  // by the caller) and returns how many were read: 0 at or past the end of the file, and possibly
  // fewer than `n` before it (call again).
  virtual StatusOr<size_t> ReadAt(uint64_t offset, size_t n, char* scratch) = 0;
  // Sets the file's size to `size` bytes, dropping what lies beyond (a torn or failed write).
  virtual Status Truncate(uint64_t size) = 0;
  // The file's current size in bytes.
  virtual StatusOr<uint64_t> Size() = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // The process-wide POSIX implementation. Never null; not owned by the caller.
  static FileSystem* Default();

  // Creates or truncates `path`.
  virtual StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  // Opens `path` for appending and reading, creating it empty if missing; existing content is kept.
  virtual StatusOr<std::unique_ptr<AppendableFile>> NewAppendableFile(const std::string& path) = 0;
  virtual StatusOr<std::string> ReadFile(const std::string& path) = 0;
  virtual bool Exists(const std::string& path) = 0;
  virtual bool IsDirectory(const std::string& path) = 0;
  // Creates `path` and missing parents; OK if it already exists as a directory.
  virtual Status CreateDirs(const std::string& path) = 0;
  // Names (not paths) of the entries of directory `path`, sorted, without "." and "..".
  virtual StatusOr<std::vector<std::string>> ListDir(const std::string& path) = 0;
  // Atomically renames; `to` must not be a non-empty directory.
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // Removes a file or a directory tree. OK if `path` does not exist.
  virtual Status RemoveAll(const std::string& path) = 0;
  // fsyncs the directory itself, making renames and creations inside it durable.
  virtual Status SyncDir(const std::string& path) = 0;
};

// A FileSystem that passes every call to `base` (not owned; must outlive this). Test fakes derive
// from it and override only the operations they change (inject a fault, count calls).
class ForwardingFileSystem : public FileSystem {
 public:
  explicit ForwardingFileSystem(FileSystem* base) : base_(base) {}
  StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    return base_->NewWritableFile(path);
  }
  StatusOr<std::unique_ptr<AppendableFile>> NewAppendableFile(const std::string& path) override {
    return base_->NewAppendableFile(path);
  }
  StatusOr<std::string> ReadFile(const std::string& path) override { return base_->ReadFile(path); }
  bool Exists(const std::string& path) override { return base_->Exists(path); }
  bool IsDirectory(const std::string& path) override { return base_->IsDirectory(path); }
  Status CreateDirs(const std::string& path) override { return base_->CreateDirs(path); }
  StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    return base_->ListDir(path);
  }
  Status Rename(const std::string& from, const std::string& to) override { return base_->Rename(from, to); }
  Status RemoveAll(const std::string& path) override { return base_->RemoveAll(path); }
  Status SyncDir(const std::string& path) override { return base_->SyncDir(path); }

 protected:
  FileSystem* base() const { return base_; }

 private:
  FileSystem* base_;
};

// Writes `data` to `path` through a temporary sibling file, fsyncs and renames it into
// place, so readers see either the old or the new content, never a mix.
Status WriteFileAtomic(FileSystem* fs, const std::string& path, std::string_view data);

// Files and folders that only this user may read, for what the agent writes into a folder other
// processes can reach (a Slurm job folder on a shared filesystem; docs/slurm.md). The one policy:
//   * WritePrivateFile: `data` goes to a sibling "<path>.tmp" created with O_CREAT | O_EXCL |
//     O_NOFOLLOW and mode 0600 (a stale one is unlinked first, never followed), is fsynced and renamed
//     over `path` (the folder fsynced too), so a link planted at either name is replaced, never
//     written through, and readers see the old or the new content. Errors: ErrnoError naming the file.
//   * MakePrivateDir: mkdir(path, 0700) that fails when anything already has that name
//     (ALREADY_EXISTS "'<path>' already exists ...": a folder someone else made is never reused);
//     with `exclusive` false an existing folder (not a link) of this user is accepted and made 0700.
//   * CheckTrustedDir: `path` (not followed when a link) is a folder of this user that neither group
//     nor others may write. FAILED_PRECONDITION when it is not a folder; PERMISSION_DENIED naming
//     `what`, the path, and the owner or the mode ("chmod go-w").
Status WritePrivateFile(const std::string& path, std::string_view data);
Status MakePrivateDir(const std::string& path, bool exclusive);
Status CheckTrustedDir(const std::string& path, const std::string& what);

// Writes all of `data` to the open descriptor `fd`, retrying interrupted and partial writes.
// Errors read "cannot write '<path>': <strerror>" (`path` only names the file in messages).
Status WriteFully(int fd, std::string_view data, const std::string& path);
// The same at file offset `offset` (pwrite(2)); the descriptor's own offset is unchanged. Safe to call
// from several threads on one descriptor for disjoint ranges.
Status PwriteFully(int fd, const char* data, size_t size, uint64_t offset, const std::string& path);
// Reads exactly `size` bytes at `offset` (pread(2)); a file that ends first is DATA_LOSS naming `path`.
Status PreadFully(int fd, char* data, size_t size, uint64_t offset, const std::string& path);
// Reads the file at `path` from its start to its end, handing each read (at most `chunk_bytes`, never
// empty) to `each`, in order; interrupted reads are retried. Errors: ErrnoError "cannot open" / "cannot
// read" naming `path`.
Status ForEachChunk(const std::string& path, size_t chunk_bytes,
                    const std::function<void(std::string_view chunk)>& each);

// Joins path components with '/'.
std::string JoinPath(std::string_view a, std::string_view b);

}  // namespace sftctl
