#include "agent/process/command_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/os/process_util.h"

namespace sftctl::agent {
namespace {

class PosixCommandRunner final : public CommandRunner {
 public:
  explicit PosixCommandRunner(ChildKind env) : env_(env) {}
  StatusOr<CommandOutcome> Run(const std::string& command, std::chrono::seconds timeout) override;

 private:
  const ChildKind env_;
};

// posix_spawn of `/bin/sh -c command` writing to `out_fd`, in a new process group with default signals,
// with the environment a child of `kind` gets (common/os/process_util.h: no HF_TOKEN, no other secret).
StatusOr<pid_t> Spawn(const std::string& command, int out_fd, ChildKind kind) {
  std::vector<std::string> env = ChildEnvironment(kind);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, out_fd, STDERR_FILENO);
  // sftd blocks its shutdown signals in every thread and ignores SIGPIPE: the command gets neither.
  sigset_t empty, defaults;
  sigemptyset(&empty);
  sigemptyset(&defaults);
  for (int s : {SIGPIPE, SIGTERM, SIGINT, SIGHUP}) sigaddset(&defaults, s);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  std::string sh = "/bin/sh", dash_c = "-c", cmd = command;
  char* argv[] = {sh.data(), dash_c.data(), cmd.data(), nullptr};
  pid_t pid = 0;
  int rc = ::posix_spawn(&pid, "/bin/sh", &fa, &attr, argv, envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return InternalError(std::string("cannot start /bin/sh: ") + std::strerror(rc));
  return pid;
}

StatusOr<CommandOutcome> PosixCommandRunner::Run(const std::string& command, std::chrono::seconds timeout) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return InternalError(std::string("pipe: ") + std::strerror(errno));
  auto pid = Spawn(command, p[1], env_);
  ::close(p[1]);
  if (!pid.ok()) {
    ::close(p[0]);
    return pid.status();
  }
  CommandOutcome out;
  const Clock* clock = Clock::Real();
  const auto deadline = clock->Now() + timeout;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock->Now());
    if (left.count() <= 0) {
      out.timed_out = true;
      ::killpg(*pid, SIGKILL);
      break;
    }
    pollfd pfd{p[0], POLLIN, 0};
    int n = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    ssize_t k = ::read(p[0], buf, sizeof(buf));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;  // EOF: the command (and whatever kept its output open) is done
    const size_t room = kMaxCommandOutput - std::min(kMaxCommandOutput, out.output.size());
    out.output.append(buf, std::min(room, static_cast<size_t>(k)));
  }
  ::close(p[0]);
  int status = 0;
  while (::waitpid(*pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) out.signal = WTERMSIG(status);
  if (WIFEXITED(status)) out.exit_code = WEXITSTATUS(status);
  if (out.timed_out) out.timeout_s = timeout.count();
  return out;
}

}  // namespace

std::string CommandOutcome::Describe() const {
  if (timed_out) return "timed out after " + std::to_string(timeout_s) + " s";
  return DescribeExit(exit_code, signal);
}

std::unique_ptr<CommandRunner> CommandRunner::NewPosix(ChildKind env) {
  return std::make_unique<PosixCommandRunner>(env);
}

}  // namespace sftctl::agent
