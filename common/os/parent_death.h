// ParentDeathSignal: a child process started with fork() gets a signal once the process that
// started it dies (so ranks do not outlive a killed sftctl).
//
// Linux: prctl(PR_SET_PDEATHSIG) in the child. Note Linux sends it when the *thread* that forked
// exits; fork from a thread that lives as long as the children (sftctl's main thread does).
// Elsewhere (macOS): a parent-death pipe. The parent holds its write end (close-on-exec); between
// fork and exec, ArmInChild() forks a tiny watcher process that keeps only the read end plus a
// second "alive" pipe whose write end the child keeps across exec. When the parent dies (its write
// end closes) the watcher sends the signal to the child; when the child exits (the alive pipe
// closes) the watcher exits. The watcher is a child of the child, in its process group, holds no
// other descriptor, and resets SIGINT/SIGTERM/SIGHUP to their defaults. The child keeps the alive
// pipe's write end open at a descriptor >= 10 (its one inherited descriptor; harmless).
//
// Usage: Create() in the parent before forking; ArmInChild() in each child right after fork (and
// before any dup2 onto descriptors below 10); keep the object alive until the children are reaped
// (destroying it counts as the parent's death for the pipe kind: armed children still running are
// signalled). Not thread-safe; ArmInChild() is async-signal-safe (fork, pipe, poll, kill, close).
#pragma once

#include <sys/types.h>

#include <memory>

#include "common/status.h"

namespace sftctl {

class ParentDeathSignal {
 public:
  enum class Kind {
    kBest,   // kPrctl on Linux, else kPipe
    kPrctl,  // Linux only (UNIMPLEMENTED elsewhere)
    kPipe,   // any POSIX system
  };

  // `sig`: what the child gets (e.g. SIGTERM).
  static StatusOr<std::unique_ptr<ParentDeathSignal>> Create(int sig, Kind kind = Kind::kBest);
  ~ParentDeathSignal();
  ParentDeathSignal(const ParentDeathSignal&) = delete;
  ParentDeathSignal& operator=(const ParentDeathSignal&) = delete;

  // In the child, between fork and exec. False when the parent is already gone (the caller should
  // _exit) or the watcher could not be started (the child then runs unprotected; the caller may
  // go on). Async-signal-safe.
  bool ArmInChild() const;

  Kind kind() const { return kind_; }

 private:
  ParentDeathSignal(Kind kind, int sig) : kind_(kind), sig_(sig) {}
  [[noreturn]] void RunWatcher(int alive_read, pid_t child) const;
  Kind kind_;
  int sig_;
  pid_t parent_ = 0;
  int death_read_ = -1;   // kPipe: watchers keep this; EOF once the parent's write end closes
  int death_write_ = -1;  // kPipe: only the parent holds it
  int max_fd_ = 0;        // kPipe: the watcher closes descriptors below this
};

}  // namespace sftctl
