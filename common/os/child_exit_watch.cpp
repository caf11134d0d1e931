#include "common/os/child_exit_watch.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

#include "common/os/process_util.h"

namespace sftctl {
namespace {

// The SIGCHLD kind's process-wide state. The handler reads it; Create/~ChildExitWatch write it
// while SIGCHLD is blocked in this thread and before/after the handler is installed.
std::atomic<Waker*> g_sigchld_waker{nullptr};
struct sigaction g_old_sigchld {};

void OnSigchld(int sig, siginfo_t* info, void* ctx) {
  if (Waker* w = g_sigchld_waker.load()) w->Wake();
  const struct sigaction& old = g_old_sigchld;
  if (old.sa_flags & SA_SIGINFO) {
    if (old.sa_sigaction != nullptr) old.sa_sigaction(sig, info, ctx);
  } else if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN && old.sa_handler != nullptr) {
    old.sa_handler(sig);
  }
}

bool KernelHasPidFd() {
  int fd = OpenPidFd(::getpid());
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

}  // namespace

StatusOr<std::unique_ptr<ChildExitWatch>> ChildExitWatch::Create(Kind kind) {
  if (kind == Kind::kBest) kind = KernelHasPidFd() ? Kind::kPidFd : Kind::kSigchldPipe;
  if (kind == Kind::kPidFd) {
    if (!KernelHasPidFd()) return UnimplementedError("pidfd_open: this system has none");
    return std::unique_ptr<ChildExitWatch>(new ChildExitWatch(kind));
  }
  if (g_sigchld_waker.load() != nullptr) {
    return FailedPreconditionError("a SIGCHLD child-exit watch already exists in this process");
  }
  std::unique_ptr<ChildExitWatch> w(new ChildExitWatch(kind));
  SFT_ASSIGN_OR_RETURN(w->waker_, Waker::Create(Waker::Kind::kPipe));
  g_sigchld_waker.store(w->waker_.get());
  struct sigaction sa {};
  sa.sa_sigaction = OnSigchld;
  sigemptyset(&sa.sa_mask);  // no "::": a macro on macOS
  sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_NOCLDSTOP;
  if (::sigaction(SIGCHLD, &sa, &g_old_sigchld) != 0) {
    int err = errno;
    g_sigchld_waker.store(nullptr);
    return ErrnoError("cannot install a handler for", "SIGCHLD", err);
  }
  return w;
}

ChildExitWatch::~ChildExitWatch() {
  for (const Watched& w : watched_) {
    if (w.pidfd >= 0) ::close(w.pidfd);
  }
  if (kind_ == Kind::kSigchldPipe) {
    ::sigaction(SIGCHLD, &g_old_sigchld, nullptr);
    g_sigchld_waker.store(nullptr);
  }
}

void ChildExitWatch::Watch(pid_t pid) {
  int fd = -1;
  if (kind_ == Kind::kPidFd) {
    fd = OpenPidFd(pid);
    if (fd < 0) pending_ = true;
  }
  watched_.push_back({pid, fd});
}

void ChildExitWatch::Forget(pid_t pid) {
  auto it = std::find_if(watched_.begin(), watched_.end(), [&](const Watched& w) { return w.pid == pid; });
  if (it == watched_.end()) return;
  if (it->pidfd >= 0) ::close(it->pidfd);
  watched_.erase(it);
}

bool ChildExitWatch::Wait(int timeout_ms) {
  if (pending_) {
    pending_ = false;
    return true;
  }
  std::vector<pollfd> fds;
  if (kind_ == Kind::kSigchldPipe) {
    fds.push_back({waker_->fd(), POLLIN, 0});
  } else {
    for (const Watched& w : watched_) fds.push_back({w.pidfd, POLLIN, 0});
  }
  int rc = ::poll(fds.data(), fds.size(), timeout_ms);
  // SIGCHLD itself interrupts the poll (poll is never restarted): look again without waiting.
  if (rc < 0 && errno == EINTR) rc = ::poll(fds.data(), fds.size(), 0);
  if (rc <= 0) return false;
  if (kind_ == Kind::kSigchldPipe) waker_->Drain();
  return true;
}

}  // namespace sftctl
