#include "client/transfer/checkpoint_key.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "client/remote/registry_file.h"
#include "client/remote/remote_options.h"
#include "common/object_store/manifest_key.h"
#include "common/os/file_system.h"

namespace sftctl::client {
namespace {

constexpr size_t kKeyBytes = 32;

// A new key file at `path`, whole or not at all: written to a private temporary file, then linked
// into place (link() never replaces: when another process made one first, that one stays and this
// one is dropped, so a reader never sees a half-written key). OK when one exists already.
Status MakeKeyFile(const std::string& path) {
  const std::string tmp = path + ".tmp-" + RandomHex(8);  // (a name no other process or thread picks)
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("create", tmp, errno);
  Status written = WriteFully(fd, RandomHex(kKeyBytes) + "\n", tmp);
  if (written.ok() && ::fsync(fd) != 0) written = ErrnoError("fsync", tmp, errno);
  ::close(fd);
  const int linked = written.ok() ? ::link(tmp.c_str(), path.c_str()) : -1;
  const int link_errno = errno;
  ::unlink(tmp.c_str());
  SFT_RETURN_IF_ERROR(written);
  if (linked != 0 && link_errno != EEXIST) return ErrnoError("link", path, link_errno);
  return OkStatus();
}

// The master key: the file's text, after checking that only this user can read it.
StatusOr<std::string> ReadKeyFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", path, errno);
  struct stat st {};
  std::string text(2 * kKeyBytes + 1, '\0');
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const ssize_t n = ::read(fd, text.data(), text.size());
  ::close(fd);
  if (!stat_ok || n < 0) return ErrnoError("read", path, errno);
  if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0)
    return FailedPreconditionError(path + ": the checkpoint key must be yours and private (chmod 600 " +
                                   path + ")");
  text.resize(static_cast<size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (text.size() < 32) return DataLossError(path + ": not a checkpoint key (remove it: a new one is made)");
  return text;
}

}  // namespace

std::string CheckpointKeyPath() { return ClientConfigDir() + "/checkpoint.key"; }

StatusOr<std::string> CheckpointRunKey(const std::string& s3_url) {
  const std::string dir = ClientConfigDir(), path = CheckpointKeyPath();
  if (::access(path.c_str(), F_OK) != 0) {
    SFT_RETURN_IF_ERROR(FileSystem::Default()->CreateDirs(dir));
    ::chmod(dir.c_str(), 0700);
    SFT_RETURN_IF_ERROR(MakeKeyFile(path));
  }
  SFT_ASSIGN_OR_RETURN(std::string master, ReadKeyFile(path));
  return DeriveRunKey(master, s3_url);
}

}  // namespace sftctl::client
