#include "client/remote/ssh/proxy_command.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>

#include "common/mutex.h"
#include "common/os/fd_util.h"
#include "common/os/process_util.h"

namespace sftctl::client::ssh {
namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr size_t kStderrTail = 4096;

class ProxyCommandTransport : public SshTransport {
 public:
  ProxyCommandTransport(std::string command, pid_t pid, int fd, int err_fd)
      : command_(std::move(command)), pid_(pid), fd_(fd), err_fd_(err_fd) {
    reader_ = std::thread([this] { ReadStderr(); });
  }
  ~ProxyCommandTransport() override {
    ::close(fd_);  // the proxy sees EOF on its stdin
    if (!Reap(std::chrono::milliseconds(0))) {
      ::kill(pid_, SIGTERM);
      if (!Reap(std::chrono::milliseconds(1000))) {
        ::kill(pid_, SIGKILL);
        Reap(std::chrono::milliseconds(-1));
      }
    }
    stop_.store(true);
    reader_.join();
    ::close(err_fd_);
  }
  int fd() const override { return fd_; }
  std::vector<std::string> Hops() const override { return {"ProxyCommand `" + command_ + "`"}; }

  std::string Problem() override {
    // A proxy that failed has usually exited; give it a moment, then its stderr a moment to arrive.
    const bool exited = Reap(std::chrono::milliseconds(1000));
    MutexLock l(&mu_);
    if (exited)
      eof_cv_.WaitFor(&mu_, std::chrono::milliseconds(500), [&]() REQUIRES(mu_) { return stderr_eof_; });
    std::string tail = tail_;
    while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r')) tail.pop_back();
    std::string p =
        "ProxyCommand `" + command_ + "` " +
        (exited ? "ended (" + DescribeExit(exit_code_, exit_signal_) + ")" : std::string("is still running"));
    return p + (tail.empty() ? "; it printed nothing on stderr" : "; its stderr: " + tail);
  }

 private:
  // waitpid with a timeout (negative: block). True once the child has been reaped.
  bool Reap(std::chrono::milliseconds timeout) {
    if (reaped_) return true;
    const auto deadline = SteadyClock::now() + timeout;
    for (;;) {
      int st = 0;
      pid_t r = ::waitpid(pid_, &st, timeout.count() < 0 ? 0 : WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        exit_code_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        exit_signal_ = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
        return true;
      }
      if (r < 0 && errno != EINTR) return false;
      if (timeout.count() >= 0 && SteadyClock::now() >= deadline) return false;
      if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  void ReadStderr() {
    char buf[1024];
    while (!stop_.load()) {
      pollfd p{err_fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      ssize_t n = ::read(err_fd_, buf, sizeof(buf));
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) break;
      ssize_t off = 0;
      while (off < n) {
        ssize_t w = ::write(2, buf + off, static_cast<size_t>(n - off));
        if (w <= 0) break;
        off += w;
      }
      MutexLock l(&mu_);
      tail_.append(buf, static_cast<size_t>(n));
      if (tail_.size() > kStderrTail) tail_.erase(0, tail_.size() - kStderrTail);
    }
    MutexLock l(&mu_);
    stderr_eof_ = true;
    eof_cv_.NotifyAll();
  }

  const std::string command_;
  const pid_t pid_;
  const int fd_, err_fd_;
  bool reaped_ = false;
  int exit_code_ = -1, exit_signal_ = 0;
  std::atomic<bool> stop_{false};
  Mutex mu_;
  CondVar eof_cv_;  // stderr_eof_ was set
  std::string tail_ GUARDED_BY(mu_);
  bool stderr_eof_ GUARDED_BY(mu_) = false;
  std::thread reader_;
};

}  // namespace

StatusOr<std::unique_ptr<SshTransport>> StartProxyCommand(const std::string& command) {
  int sv[2];
  SFT_RETURN_IF_ERROR(MakeSocketPair(AF_UNIX, SOCK_STREAM, sv));
  int err[2];
  if (Status s = MakePipe(err); !s.ok()) {
    ::close(sv[0]);
    ::close(sv[1]);
    return s;
  }
  // Everything the child needs is prepared before fork: it may only make async-signal-safe calls.
  const std::string script = "exec " + command;
  const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
  pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    for (int fd : {sv[0], sv[1], err[0], err[1]}) ::close(fd);
    return ErrnoError("fork", "ProxyCommand", e);
  }
  if (pid == 0) {
    // dup2 clears close-on-exec on the copies; every other descriptor of sftctl is close-on-exec.
    ::dup2(sv[1], 0);
    ::dup2(sv[1], 1);
    ::dup2(err[1], 2);
    ::signal(SIGPIPE, SIG_DFL);
    ::execv(argv[0], const_cast<char* const*>(argv));
    _exit(127);
  }
  ::close(sv[1]);
  ::close(err[1]);
  return std::unique_ptr<SshTransport>(new ProxyCommandTransport(command, pid, sv[0], err[0]));
}

}  // namespace sftctl::client::ssh
