#include "common/os/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace sftctl {

StatusOr<FileLock> FileLock::Acquire(const std::string& path, const std::function<bool()>& cancelled,
                                     const std::function<void()>& on_wait, std::chrono::milliseconds poll) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return InternalError("cannot open the lock file " + path + ": " + std::strerror(errno));
  FileLock lock(fd);
  bool waited = false;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return InternalError("cannot lock " + path + ": " + std::strerror(errno));
    if (!waited && on_wait) on_wait();
    waited = true;
    if (cancelled && cancelled()) return CancelledError("cancelled while waiting for the lock " + path);
    std::this_thread::sleep_for(poll);
  }
  return lock;
}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

}  // namespace sftctl
