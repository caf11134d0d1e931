// ChildExitWatch: sleep until one of our child processes may have exited, instead of polling
// waitpid on a timer. Linux watches each child's pidfd; other systems (macOS), or Linux kernels
// without pidfd_open, use a self-pipe written by a SIGCHLD handler.
//
// Contract:
//   * Wait() returns early when a watched child may have exited; wake-ups can be spurious (the
//     SIGCHLD kind wakes for any child, e.g. a popen()), so callers always reap with
//     waitpid(pid, ..., WNOHANG) afterwards and loop. It never reaps anything itself.
//   * Kind::kSigchldPipe installs a process-wide SIGCHLD handler (SA_RESTART | SA_NOCLDSTOP; a
//     previous handler function is still called) from Create() until destruction, when the previous
//     disposition is restored. Create it BEFORE forking the children, so no exit is missed. At most
//     one such watch exists at a time (FAILED_PRECONDITION otherwise).
//
// Not thread-safe: one thread owns a watch (its signal handler part is async-signal-safe).
#pragma once

#include <sys/types.h>

#include <memory>
#include <vector>

#include "common/os/waker.h"
#include "common/status.h"

namespace sftctl {

class ChildExitWatch {
 public:
  enum class Kind {
    kBest,         // kPidFd when this kernel has pidfd_open, else kSigchldPipe
    kPidFd,        // Linux >= 5.3 (UNIMPLEMENTED elsewhere)
    kSigchldPipe,  // any POSIX system
  };

  static StatusOr<std::unique_ptr<ChildExitWatch>> Create(Kind kind = Kind::kBest);
  ~ChildExitWatch();
  ChildExitWatch(const ChildExitWatch&) = delete;
  ChildExitWatch& operator=(const ChildExitWatch&) = delete;

  // Starts watching `pid` (a child of this process, not yet reaped). If its pidfd cannot be opened
  // (it was already reaped elsewhere), the next Wait() returns at once.
  void Watch(pid_t pid);
  // Stops watching `pid` (after reaping it).
  void Forget(pid_t pid);

  // Blocks up to `timeout_ms` (< 0: no limit). True when a watched child may have exited; false on
  // timeout, or when another signal interrupted the wait (the caller checks its own signal flags).
  bool Wait(int timeout_ms);

  Kind kind() const { return kind_; }

 private:
  struct Watched {
    pid_t pid;
    int pidfd;  // kPidFd only
  };
  explicit ChildExitWatch(Kind kind) : kind_(kind) {}
  Kind kind_;
  std::vector<Watched> watched_;
  bool pending_ = false;          // a Watch() that could not open a pidfd
  std::unique_ptr<Waker> waker_;  // kSigchldPipe: written by the SIGCHLD handler
};

}  // namespace sftctl
