// Waker: a descriptor that poll(2) sees readable once another thread (or a signal handler) asked
// the poller to wake up. Linux uses an eventfd; other systems (macOS) a non-blocking self-pipe.
//
// Thread safety: Wake() may be called from any thread and from signal handlers (it only write()s);
// Drain() and fd() belong to the one polling thread. The Waker owns its descriptors and closes them
// when destroyed; it must outlive every thread that may still call Wake().
#pragma once

#include <memory>

#include "common/status.h"

namespace sftctl {

class Waker {
 public:
  enum class Kind {
    kBest,     // kEventFd where the system has it, else kPipe
    kEventFd,  // Linux only (UNIMPLEMENTED elsewhere)
    kPipe,     // any POSIX system
  };

  static StatusOr<std::unique_ptr<Waker>> Create(Kind kind = Kind::kBest);
  ~Waker();
  Waker(const Waker&) = delete;
  Waker& operator=(const Waker&) = delete;

  // Poll this for POLLIN. It stays readable until Drain().
  int fd() const { return read_fd_; }
  // Makes fd() readable. Never blocks; waking an already woken Waker is a no-op. Async-signal-safe.
  void Wake();
  // Consumes every pending wake-up: fd() is not readable afterwards (until the next Wake()).
  void Drain();
  // kEventFd or kPipe: what Create chose.
  Kind kind() const { return kind_; }

 private:
  Waker(Kind kind, int read_fd, int write_fd) : kind_(kind), read_fd_(read_fd), write_fd_(write_fd) {}
  Kind kind_;
  int read_fd_;
  int write_fd_;  // == read_fd_ for an eventfd
};

}  // namespace sftctl
