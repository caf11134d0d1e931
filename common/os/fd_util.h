// Descriptor portability seam: pipes and sockets created close-on-exec (and non-blocking when
// asked), send() without SIGPIPE, and a socket's unsent byte count.
//
// Linux creates a descriptor and sets its flags in one call (pipe2, SOCK_CLOEXEC | SOCK_NONBLOCK),
// so no other thread's fork+exec can inherit it in between. Other POSIX systems (macOS) have no such
// calls: there the descriptor is created, then flagged with fcntl (a concurrent fork+exec may
// inherit it in that window; sftctl's children are started from one thread, so this is benign).
// FdImpl::kPortable asks for the fcntl path on any system, so Linux tests exercise the macOS code.
//
// Stateless and thread-safe. Every function leaves no descriptor open when it fails. UniqueFd owns one
// descriptor (used by one thread at a time).
#pragma once

#include <sys/types.h>

#include <cstddef>

#include "common/status.h"

namespace sftctl {

// Owns a descriptor (or none: -1) and closes it when destroyed, ignoring close's result; call Close()
// first where that result matters (a written file). Movable, not copyable.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { (void)Close(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives the descriptor up to the caller (-1 when none is held); this one then holds none.
  int Release();
  // Closes the descriptor now: close(2)'s result, 0 when none was held. Holds none afterwards.
  int Close();

 private:
  int fd_ = -1;
};

enum class FdImpl {
  kNative,    // the fastest correct calls this system has
  kPortable,  // plain POSIX: create, then fcntl (what macOS gets)
};

struct FdFlags {
  bool nonblocking = false;  // O_NONBLOCK on every descriptor made
};

// Sets FD_CLOEXEC / O_NONBLOCK on `fd`, keeping its other flags.
Status SetCloseOnExec(int fd);
Status SetNonBlocking(int fd);

// A pipe whose two ends (fds[0] reads, fds[1] writes) are close-on-exec.
Status MakePipe(int fds[2], FdFlags flags = {}, FdImpl impl = FdImpl::kNative);

// A close-on-exec socket (`type` is SOCK_STREAM etc., without flag bits). Where the system has
// SO_NOSIGPIPE (macOS) it is set, so writing to a closed peer returns EPIPE instead of raising
// SIGPIPE; see also SendNoSignal.
StatusOr<int> MakeSocket(int domain, int type, int protocol, FdFlags flags = {},
                         FdImpl impl = FdImpl::kNative);

// A connected socketpair, both ends close-on-exec (and SO_NOSIGPIPE where it exists). `flags` apply
// to both ends.
Status MakeSocketPair(int domain, int type, int fds[2], FdFlags flags = {}, FdImpl impl = FdImpl::kNative);

// send(2) that never raises SIGPIPE: MSG_NOSIGNAL where the system has it, and SO_NOSIGPIPE (set by
// MakeSocket/MakeSocketPair) where it does not. Returns what send returns (-1 with errno EPIPE when
// the peer has closed).
ssize_t SendNoSignal(int fd, const void* buf, size_t len, int flags);

// How many bytes `fd`'s socket still holds unsent (Linux SIOCOUTQ, macOS SO_NWRITE), or -1 where
// the system cannot tell (callers then rely on poll's POLLOUT alone). kPortable answers as a system
// with neither call would: -1.
long SendQueueBytes(int fd, FdImpl impl = FdImpl::kNative);

}  // namespace sftctl
