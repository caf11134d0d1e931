#include "common/os/fd_util.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#if defined(__linux__)
#include <linux/sockios.h>  // SIOCOUTQ
#endif

#include <cerrno>

namespace sftctl {
namespace {

void CloseKeepErrno(int fd) {
  int err = errno;
  ::close(fd);
  errno = err;
}

Status AddFdFlag(int fd, int get, int set, int flag, const char* what) {
  int old = ::fcntl(fd, get);
  if (old < 0 || ::fcntl(fd, set, old | flag) < 0) {
    return ErrnoError(what, "descriptor " + std::to_string(fd), errno);
  }
  return OkStatus();
}

// The portable path's flags for a descriptor just made: close-on-exec, non-blocking if asked.
Status ApplyFlags(int fd, FdFlags flags) {
  SFT_RETURN_IF_ERROR(SetCloseOnExec(fd));
  if (flags.nonblocking) SFT_RETURN_IF_ERROR(SetNonBlocking(fd));
  return OkStatus();
}

// SO_NOSIGPIPE where it exists (macOS); Linux uses MSG_NOSIGNAL per send instead.
void SetNoSigPipe(int fd) {
#if defined(SO_NOSIGPIPE)
  int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof(one));
#else
  (void)fd;
#endif
}

// Flag bits for socket()/socketpair() on systems that take them in `type`; 0 otherwise.
int NativeSocketBits(FdFlags flags) {
#if defined(SOCK_CLOEXEC) && defined(SOCK_NONBLOCK)
  return SOCK_CLOEXEC | (flags.nonblocking ? SOCK_NONBLOCK : 0);
#else
  (void)flags;
  return 0;
#endif
}

bool HasNativeSocketBits() {
#if defined(SOCK_CLOEXEC) && defined(SOCK_NONBLOCK)
  return true;
#else
  return false;
#endif
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    (void)Close();
    fd_ = other.Release();
  }
  return *this;
}

int UniqueFd::Release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

int UniqueFd::Close() {
  if (fd_ < 0) return 0;
  const int r = ::close(fd_);
  fd_ = -1;
  return r;
}

Status SetCloseOnExec(int fd) {
  return AddFdFlag(fd, F_GETFD, F_SETFD, FD_CLOEXEC, "cannot set FD_CLOEXEC on");
}

Status SetNonBlocking(int fd) {
  return AddFdFlag(fd, F_GETFL, F_SETFL, O_NONBLOCK, "cannot set O_NONBLOCK on");
}

Status MakePipe(int fds[2], FdFlags flags, FdImpl impl) {
#if defined(__linux__)
  if (impl == FdImpl::kNative) {
    if (::pipe2(fds, O_CLOEXEC | (flags.nonblocking ? O_NONBLOCK : 0)) != 0) {
      return ErrnoError("cannot create", "a pipe", errno);
    }
    return OkStatus();
  }
#endif
  (void)impl;
  if (::pipe(fds) != 0) return ErrnoError("cannot create", "a pipe", errno);
  for (int i = 0; i < 2; ++i) {
    Status s = ApplyFlags(fds[i], flags);
    if (!s.ok()) {
      CloseKeepErrno(fds[0]);
      CloseKeepErrno(fds[1]);
      return s;
    }
  }
  return OkStatus();
}

StatusOr<int> MakeSocket(int domain, int type, int protocol, FdFlags flags, FdImpl impl) {
  const bool native = impl == FdImpl::kNative && HasNativeSocketBits();
  int fd = ::socket(domain, type | (native ? NativeSocketBits(flags) : 0), protocol);
  if (fd < 0) return ErrnoError("cannot create", "a socket", errno);
  if (!native) {
    Status s = ApplyFlags(fd, flags);
    if (!s.ok()) {
      CloseKeepErrno(fd);
      return s;
    }
  }
  SetNoSigPipe(fd);
  return fd;
}

Status MakeSocketPair(int domain, int type, int fds[2], FdFlags flags, FdImpl impl) {
  const bool native = impl == FdImpl::kNative && HasNativeSocketBits();
  if (::socketpair(domain, type | (native ? NativeSocketBits(flags) : 0), 0, fds) != 0) {
    return ErrnoError("cannot create", "a socketpair", errno);
  }
  for (int i = 0; i < 2; ++i) {
    Status s = native ? OkStatus() : ApplyFlags(fds[i], flags);
    if (!s.ok()) {
      CloseKeepErrno(fds[0]);
      CloseKeepErrno(fds[1]);
      return s;
    }
    SetNoSigPipe(fds[i]);
  }
  return OkStatus();
}

ssize_t SendNoSignal(int fd, const void* buf, size_t len, int flags) {
#if defined(MSG_NOSIGNAL)
  flags |= MSG_NOSIGNAL;
#endif
  return ::send(fd, buf, len, flags);
}

long SendQueueBytes(int fd, FdImpl impl) {
  if (impl == FdImpl::kPortable) return -1;
#if defined(SIOCOUTQ)
  int queued = 0;
  return ::ioctl(fd, SIOCOUTQ, &queued) == 0 ? queued : -1;
#elif defined(SO_NWRITE)
  int queued = 0;
  socklen_t len = sizeof(queued);
  return ::getsockopt(fd, SOL_SOCKET, SO_NWRITE, &queued, &len) == 0 ? queued : -1;
#else
  (void)fd;
  return -1;
#endif
}

}  // namespace sftctl
