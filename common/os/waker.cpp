#include "common/os/waker.h"

#include <unistd.h>

#if defined(__linux__)
#include <sys/eventfd.h>
#endif

#include <cerrno>
#include <cstdint>

#include "common/os/fd_util.h"

namespace sftctl {

StatusOr<std::unique_ptr<Waker>> Waker::Create(Kind kind) {
#if defined(__linux__)
  if (kind == Kind::kBest || kind == Kind::kEventFd) {
    int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) return ErrnoError("cannot create", "an eventfd", errno);
    return std::unique_ptr<Waker>(new Waker(Kind::kEventFd, fd, fd));
  }
#else
  if (kind == Kind::kEventFd) return UnimplementedError("eventfd: this system has none (use a pipe)");
#endif
  int fds[2];
  SFT_RETURN_IF_ERROR(MakePipe(fds, FdFlags{/*nonblocking=*/true}));
  return std::unique_ptr<Waker>(new Waker(Kind::kPipe, fds[0], fds[1]));
}

Waker::~Waker() {
  ::close(read_fd_);
  if (write_fd_ != read_fd_) ::close(write_fd_);
}

void Waker::Wake() {
  int err = errno;  // a signal handler must not change errno
  if (kind_ == Kind::kEventFd) {
    uint64_t one = 1;
    (void)!::write(write_fd_, &one, sizeof(one));
  } else {
    char byte = 1;
    (void)!::write(write_fd_, &byte, 1);  // EAGAIN: the pipe is full, so already readable
  }
  errno = err;
}

void Waker::Drain() {
  // An eventfd read returns the whole counter at once; a pipe may need several reads.
  char buf[256];
  for (;;) {
    ssize_t n = ::read(read_fd_, buf, sizeof(buf));
    if ((n > 0 && kind_ == Kind::kPipe) || (n < 0 && errno == EINTR)) continue;
    break;
  }
}

}  // namespace sftctl
