#include "common/os/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <system_error>

namespace sftctl {
namespace {

Status SyncFd(int fd, const std::string& path) {
  if (::fsync(fd) != 0) return ErrnoError("cannot fsync", path, errno);
  return OkStatus();
}

// Closes *fd once (later calls are no-ops) and sets it to -1.
Status CloseFd(int* fd, const std::string& path) {
  int f = *fd;
  *fd = -1;
  if (f >= 0 && ::close(f) != 0) return ErrnoError("cannot close", path, errno);
  return OkStatus();
}

// The descriptor-backed part of both file kinds: sequential writes, fsync, close (once; the
// destructor closes too). `Interface` is WritableFile or AppendableFile.
template <typename Interface>
class PosixFile : public Interface {
 public:
  PosixFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixFile() override { (void)CloseFd(&fd_, path_); }

  Status Append(std::string_view data) override { return WriteFully(fd_, data, path_); }
  Status Sync() override { return SyncFd(fd_, path_); }
  Status Close() override { return CloseFd(&fd_, path_); }

 protected:
  std::string path_;
  int fd_;
};

using PosixWritableFile = PosixFile<WritableFile>;

// An O_APPEND descriptor: write(2) goes to the end, pread(2) reads anywhere without moving anything.
class PosixAppendableFile : public PosixFile<AppendableFile> {
 public:
  using PosixFile::PosixFile;

  StatusOr<size_t> ReadAt(uint64_t offset, size_t n, char* scratch) override {
    for (;;) {
      ssize_t r = ::pread(fd_, scratch, n, static_cast<off_t>(offset));
      if (r >= 0) return static_cast<size_t>(r);
      if (errno != EINTR) return ErrnoError("cannot read", path_, errno);
    }
  }

  Status Truncate(uint64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) return ErrnoError("cannot truncate", path_, errno);
    return OkStatus();
  }

  StatusOr<uint64_t> Size() override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return ErrnoError("cannot stat", path_, errno);
    return static_cast<uint64_t>(st.st_size);
  }
};

class PosixFileSystem : public FileSystem {
 public:
  StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError("cannot create", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  StatusOr<std::unique_ptr<AppendableFile>> NewAppendableFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError("cannot open", path, errno);
    return std::unique_ptr<AppendableFile>(new PosixAppendableFile(path, fd));
  }

  StatusOr<std::string> ReadFile(const std::string& path) override {
    std::string out;
    SFT_RETURN_IF_ERROR(ForEachChunk(path, 1 << 16, [&out](std::string_view chunk) { out += chunk; }));
    return out;
  }

  bool Exists(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }

  bool IsDirectory(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

  Status CreateDirs(const std::string& path) override {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) return Status(StatusCode::kInternal, "cannot create directory '" + path + "': " + ec.message());
    if (!IsDirectory(path)) return AlreadyExistsError("'" + path + "' exists and is not a directory");
    return OkStatus();
  }

  StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    DIR* d = ::opendir(path.c_str());
    if (d == nullptr) return ErrnoError("cannot list", path, errno);
    std::vector<std::string> names;
    while (struct dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(std::move(n));
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0)
      return ErrnoError("cannot rename to '" + to + "' from", from, errno);
    return OkStatus();
  }

  Status RemoveAll(const std::string& path) override {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) return Status(StatusCode::kInternal, "cannot remove '" + path + "': " + ec.message());
    return OkStatus();
  }

  Status SyncDir(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoError("cannot open directory", path, errno);
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoError("cannot fsync directory", path, err);
    return OkStatus();
  }
};

}  // namespace

FileSystem* FileSystem::Default() {
  static PosixFileSystem* fs = new PosixFileSystem();
  return fs;
}

Status WriteFully(int fd, std::string_view data, const std::string& path) {
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoError("cannot write", path, n < 0 ? errno : EIO);
    p += n;
    left -= static_cast<size_t>(n);
  }
  return OkStatus();
}

Status PwriteFully(int fd, const char* data, size_t size, uint64_t offset, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::pwrite(fd, data, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoError("cannot write", path, n < 0 ? errno : EIO);
    data += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return OkStatus();
}

Status PreadFully(int fd, char* data, size_t size, uint64_t offset, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::pread(fd, data, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("cannot read", path, errno);
    if (n == 0) return DataLossError("'" + path + "' ends before byte " + std::to_string(offset + size));
    data += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return OkStatus();
}

Status ForEachChunk(const std::string& path, size_t chunk_bytes,
                    const std::function<void(std::string_view chunk)>& each) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path, errno);
  std::vector<char> buf(std::max<size_t>(chunk_bytes, 1));
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoError("cannot read", path, err);
    }
    if (n == 0) break;
    each(std::string_view(buf.data(), static_cast<size_t>(n)));
  }
  ::close(fd);
  return OkStatus();
}

Status WritePrivateFile(const std::string& path, std::string_view data) {
  const std::string tmp = path + ".tmp";
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) return ErrnoError("cannot remove", tmp, errno);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("cannot create", tmp, errno);
  Status s = WriteFully(fd, data, tmp);
  if (s.ok()) s = SyncFd(fd, tmp);
  if (::close(fd) != 0 && s.ok()) s = ErrnoError("cannot close", tmp, errno);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
    s = ErrnoError("cannot rename to '" + path + "' from", tmp, errno);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return FileSystem::Default()->SyncDir(dir.empty() ? "." : dir);
}

Status MakePrivateDir(const std::string& path, bool exclusive) {
  if (::mkdir(path.c_str(), 0700) == 0) return OkStatus();
  const int err = errno;
  if (err == EEXIST && exclusive)
    return AlreadyExistsError("'" + path +
                              "' already exists: refusing to reuse a folder this agent did not create");
  if (err != EEXIST) return ErrnoError("cannot create the folder", path, err);
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return ErrnoError("cannot inspect", path, errno);
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
    return AlreadyExistsError("'" + path + "' already exists and is not a folder of this user");
  if (::chmod(path.c_str(), 0700) != 0) return ErrnoError("cannot make private", path, errno);
  return OkStatus();
}

Status CheckTrustedDir(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return ErrnoError("cannot inspect " + what, path, errno);
  if (!S_ISDIR(st.st_mode)) return FailedPreconditionError(what + " " + path + " is not a folder");
  if (st.st_uid != ::geteuid())
    return PermissionDeniedError(what + " " + path + " belongs to uid " + std::to_string(st.st_uid) +
                                 ", not to this user (uid " + std::to_string(::geteuid()) +
                                 "): its owner could read or replace what the agent writes there; use a "
                                 "folder of your own");
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return PermissionDeniedError(what + " " + path + " is writable by group or others (mode " + mode +
                                 "): another user could plant or swap files there; run `chmod go-w " + path +
                                 "`");
  }
  return OkStatus();
}

std::string JoinPath(std::string_view a, std::string_view b) {
  if (a.empty()) return std::string(b);
  if (b.empty()) return std::string(a);
  std::string out(a);
  if (out.back() != '/') out.push_back('/');
  if (b.front() == '/') b.remove_prefix(1);
  out.append(b);
  return out;
}

Status WriteFileAtomic(FileSystem* fs, const std::string& path, std::string_view data) {
  // A name of this writer's own: two writers of one path (two processes sharing a Hub cache, two
  // threads) never write into or rename each other's temporary file.
  static std::atomic<uint64_t> writes{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(writes++);
  SFT_ASSIGN_OR_RETURN(auto file, fs->NewWritableFile(tmp));
  Status s = file->Append(data);
  if (s.ok()) s = file->Sync();
  Status c = file->Close();
  if (s.ok()) s = c;
  if (s.ok()) s = fs->Rename(tmp, path);
  if (!s.ok()) {
    (void)fs->RemoveAll(tmp);
    return s;
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  return fs->SyncDir(dir.empty() ? "." : dir);
}

}  // namespace sftctl
