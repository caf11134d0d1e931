#include "agent/state/blob_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

namespace sftctl::agent {

Status BlobStore::Init() {
  SFT_RETURN_IF_ERROR(fs_->CreateDirs(JoinPath(dir_, "partial")));
  return OkStatus();
}

std::string BlobStore::BlobPath(const std::string& sha256) const { return JoinPath(dir_, sha256); }
std::string BlobStore::PartialDir() const { return JoinPath(dir_, "partial"); }
std::string BlobStore::PartialPath(const std::string& sha256) const { return JoinPath(PartialDir(), sha256); }

StatusOr<BlobStore::Stat> BlobStore::StatBlob(const std::string& sha256) {
  if (!IsSha256Hex(sha256)) return InvalidArgumentError("sha256: must be 64 lowercase hex digits");
  struct stat st;
  if (::stat(BlobPath(sha256).c_str(), &st) == 0) {
    // A client asking about a blob is about to use it: its mtime (last use) keeps it from gc.
    (void)::utimensat(AT_FDCWD, BlobPath(sha256).c_str(), nullptr, 0);
    return Stat{true, static_cast<uint64_t>(st.st_size), 0, {}};
  }
  {
    MutexLock lock(&mu_);
    SFT_ASSIGN_OR_RETURN(std::shared_ptr<Ranged> r, FindRanged(sha256, 0, 0, /*create=*/false));
    if (r) return RangedStat(*r);
  }
  if (::stat(PartialPath(sha256).c_str(), &st) == 0)
    return Stat{false, static_cast<uint64_t>(st.st_size), 0, {}};
  return Stat{};
}

Status BlobStore::CheckSpace(uint64_t need) const {
  struct statvfs vfs;
  if (::statvfs(dir_.c_str(), &vfs) != 0) return OkStatus();
  uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  if (avail >= need) return OkStatus();
  return ResourceExhaustedError("size: " + std::to_string(need) + " bytes needed, " + std::to_string(avail) +
                                " free in " + dir_);
}

StatusOr<std::unique_ptr<BlobStore::Upload>> BlobStore::BeginUpload(const std::string& sha256, uint64_t size,
                                                                    uint64_t offset) {
  if (!IsSha256Hex(sha256)) return InvalidArgumentError("sha256: must be 64 lowercase hex digits");
  if (offset > size) {
    return InvalidArgumentError("offset: " + std::to_string(offset) + " > size " + std::to_string(size));
  }
  {
    MutexLock lock(&mu_);
    if (active_.count(sha256)) return AbortedError("an upload of blob " + sha256 + " is already in progress");
    SFT_ASSIGN_OR_RETURN(std::shared_ptr<Ranged> r, FindRanged(sha256, 0, 0, /*create=*/false));
    if (r) {
      // A sequential upload replaces a ranged one (from offset 0: StatBlob reported no bytes for it).
      if (RangedBusy(*r)) return AbortedError("a ranged upload of blob " + sha256 + " is in progress");
      DiscardRanged(sha256);
    }
    active_.insert(sha256);
  }
  auto fail = [&](Status s) {
    Release(sha256);
    return s;
  };
  SFT_ASSIGN_OR_RETURN(Stat st, StatBlob(sha256));
  if (st.complete) return fail(AlreadyExistsError("blob " + sha256 + " is already complete"));
  if (st.size != offset) {
    return fail(FailedPreconditionError("offset: agent holds " + std::to_string(st.size) + " bytes of blob " +
                                        sha256 + ", upload starts at " + std::to_string(offset)));
  }
  if (Status space = CheckSpace(size - offset); !space.ok()) return fail(space);
  // Appends go to the end of the partial file, cut to `offset` (what a writer that died mid-write left
  // beyond the bytes StatBlob reported is dropped).
  StatusOr<std::unique_ptr<AppendableFile>> file = fs_->NewAppendableFile(PartialPath(sha256));
  if (!file.ok()) return fail(file.status());
  if (Status t = (*file)->Truncate(offset); !t.ok()) return fail(t);
  return std::unique_ptr<Upload>(new Upload(this, sha256, size, offset, std::move(*file)));
}

Status BlobStore::RemoveIfUnused(const std::string& sha256, bool partial, int64_t used_before_s) {
  if (!IsSha256Hex(sha256)) return InvalidArgumentError("sha256: must be 64 lowercase hex digits");
  const std::string path = partial ? PartialPath(sha256) : BlobPath(sha256);
  MutexLock lock(&mu_);  // BeginUpload cannot start meanwhile
  if (active_.count(sha256))
    return FailedPreconditionError("an upload of blob " + sha256 + " is in progress");
  if (partial) {
    auto r = FindRanged(sha256, 0, 0, /*create=*/false);
    if (r.ok() && *r && RangedBusy(**r)) {
      return FailedPreconditionError("a ranged upload of blob " + sha256 + " is in progress");
    }
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return ErrnoError("cannot stat", path, errno);
  if (st.st_mtime >= used_before_s) return FailedPreconditionError(path + " was used since the scan");
  if (!partial) {
    if (::unlink(path.c_str()) != 0) return ErrnoError("cannot remove", path, errno);
    return store_->DeleteBlob(sha256);
  }
  DiscardRanged(sha256);  // a ranged upload's state and log, if any, with the partial file
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoError("cannot remove", path, errno);
  return OkStatus();
}

void BlobStore::Release(const std::string& sha256) {
  MutexLock lock(&mu_);
  active_.erase(sha256);
}

BlobStore::Upload::Upload(BlobStore* owner, std::string sha, uint64_t size, uint64_t offset,
                          std::unique_ptr<AppendableFile> file)
    : owner_(owner), sha_(std::move(sha)), size_(size), pos_(offset), file_(std::move(file)) {
  if (offset == 0) hasher_ = std::make_unique<Sha256>();
}

BlobStore::Upload::~Upload() {
  if (file_) (void)file_->Close();
  if (!released_) owner_->Release(sha_);
}

Status BlobStore::Upload::Write(const std::string& data) {
  if (!file_) return FailedPreconditionError("upload already finished");
  if (pos_ + data.size() > size_) {
    return InvalidArgumentError("data: upload exceeds the declared size " + std::to_string(size_));
  }
  if (Status w = file_->Append(data); !w.ok()) {
    // A short write (full disk) left part of `data` behind: cut it off, or the file would no longer
    // match pos_ and the running hash.
    if (Status t = file_->Truncate(pos_); !t.ok()) {
      (void)file_->Close();
      file_.reset();
      return Status(w.code(), w.message() + "; the upload ends (" + t.message() + ")");
    }
    return w;
  }
  if (hasher_) hasher_->Update(data);
  pos_ += data.size();
  return OkStatus();
}

// The digest of the partial file: the running hash, or (a resumed upload) the file read back.
StatusOr<std::string> BlobStore::Upload::HexDigest() {
  if (hasher_) return hasher_->HexDigest();
  Sha256 h;
  std::vector<char> chunk(1 << 20);
  for (uint64_t off = 0;;) {
    SFT_ASSIGN_OR_RETURN(size_t n, file_->ReadAt(off, chunk.size(), chunk.data()));
    if (n == 0) break;
    h.Update(chunk.data(), n);
    off += n;
  }
  return h.HexDigest();
}

Status BlobStore::Upload::Finish() {
  std::string partial = owner_->PartialPath(sha_);
  if (!file_) return FailedPreconditionError("upload already finished");
  if (pos_ != size_) {
    // Short upload: keep the bytes for a resume.
    return DataLossError("size: received " + std::to_string(pos_) + " of " + std::to_string(size_) +
                         " bytes of blob " + sha_ + "; resume from offset " + std::to_string(pos_));
  }
  SFT_RETURN_IF_ERROR(file_->Sync());
  SFT_ASSIGN_OR_RETURN(std::string got, HexDigest());
  (void)file_->Close();  // synced above: nothing left for close to report
  file_.reset();
  released_ = true;
  owner_->Release(sha_);
  if (got != sha_) {
    (void)owner_->fs_->RemoveAll(partial);
    return DataLossError("sha256: uploaded bytes hash to " + got + ", expected " + sha_ + "; nothing stored");
  }
  SFT_RETURN_IF_ERROR(owner_->fs_->Rename(partial, owner_->BlobPath(sha_)));
  SFT_RETURN_IF_ERROR(owner_->fs_->SyncDir(owner_->dir_));
  return owner_->store_->PutBlob(sha_, size_);
}

}  // namespace sftctl::agent
