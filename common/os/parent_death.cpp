#include "common/os/parent_death.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cerrno>

#include "common/os/fd_util.h"

namespace sftctl {

StatusOr<std::unique_ptr<ParentDeathSignal>> ParentDeathSignal::Create(int sig, Kind kind) {
#if defined(__linux__)
  if (kind == Kind::kBest) kind = Kind::kPrctl;
#else
  if (kind == Kind::kPrctl) return UnimplementedError("PR_SET_PDEATHSIG: this system has none");
  if (kind == Kind::kBest) kind = Kind::kPipe;
#endif
  std::unique_ptr<ParentDeathSignal> p(new ParentDeathSignal(kind, sig));
  p->parent_ = ::getpid();
  if (kind == Kind::kPipe) {
    int fds[2];
    SFT_RETURN_IF_ERROR(MakePipe(fds));
    p->death_read_ = fds[0];
    p->death_write_ = fds[1];
    long open_max = ::sysconf(_SC_OPEN_MAX);
    p->max_fd_ = static_cast<int>(std::clamp<long>(open_max, 256, 65536));
  }
  return p;
}

ParentDeathSignal::~ParentDeathSignal() {
  if (death_read_ >= 0) ::close(death_read_);
  if (death_write_ >= 0) ::close(death_write_);
}

bool ParentDeathSignal::ArmInChild() const {
#if defined(__linux__)
  if (kind_ == Kind::kPrctl) {
    ::prctl(PR_SET_PDEATHSIG, sig_);
    return ::getppid() == parent_;
  }
#endif
  if (::getppid() != parent_) return false;
  ::close(death_write_);  // only the parent may hold it, or the watcher never sees EOF
  int alive[2];
  if (::pipe(alive) != 0) return false;
  const pid_t child = ::getpid();
  pid_t watcher = ::fork();
  if (watcher < 0) {
    ::close(alive[0]);
    ::close(alive[1]);
    return false;
  }
  if (watcher == 0) RunWatcher(alive[0], child);  // never returns
  ::close(alive[0]);
  // Keep the alive pipe's write end across exec, away from the descriptors callers dup2 onto.
  int high = ::fcntl(alive[1], F_DUPFD, 10);
  ::close(alive[1]);
  if (high < 0) return false;  // the watcher sees EOF and exits: the child runs unprotected
  return ::getppid() == parent_;
}

void ParentDeathSignal::RunWatcher(int alive_read, pid_t child) const {
  for (int fd = 0; fd < max_fd_; ++fd) {
    if (fd != alive_read && fd != death_read_) ::close(fd);
  }
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(s, SIG_DFL);
  pollfd fds[2] = {{death_read_, POLLIN, 0}, {alive_read, POLLIN, 0}};
  for (;;) {
    int rc = ::poll(fds, 2, 1000);
    if (rc < 0 && errno != EINTR) break;
    if (rc > 0 && fds[1].revents != 0) break;  // the child exited (or closed its end)
    if (rc > 0 && fds[0].revents != 0) {       // every write end closed: the parent is gone
      ::kill(child, sig_);
      break;
    }
    if (::getppid() != child) break;  // reparented: the child is gone
  }
  ::_exit(0);
}

}  // namespace sftctl
