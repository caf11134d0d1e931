#include "common/rank_group.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/os/parent_death.h"
#include "common/os/process_util.h"

namespace sftctl {
namespace {

const char* const kRankVariables[] = {"RANK",        "WORLD_SIZE",  "LOCAL_RANK",          "LOCAL_WORLD_SIZE",
                                      "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"};

bool IsRankVariable(const char* entry) {
  for (const char* name : kRankVariables) {
    const size_t n = std::strlen(name);
    if (std::strncmp(entry, name, n) == 0 && entry[n] == '=') return true;
  }
  return false;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// The rank's side of the fork: only async-signal-safe calls until exec.
[[noreturn]] void ExecRank(const RankCommand& cmd, char* const* argv, char* const* envp, pid_t pgid,
                           pid_t launcher, const ParentDeathSignal* parent_death) {
  ::setpgid(0, pgid);
  if (parent_death != nullptr) {
    (void)parent_death->ArmInChild();
    if (::getppid() != launcher) ::_exit(127);  // the launcher already died
  }
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGCHLD, SIGQUIT, SIGUSR1, SIGUSR2})
    ::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);  // no "::": a macro on macOS
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (cmd.stdout_fd >= 0) {
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0 && null_fd != 0) ::dup2(null_fd, 0);
    ::dup2(cmd.stdout_fd, 1);
    ::dup2(cmd.stderr_fd, 2);
    ::dup2(cmd.events_fd, 3);
  }
  if (!cmd.cwd.empty() && ::chdir(cmd.cwd.c_str()) != 0) {
    const char msg[] = "error: cannot enter the rank's working folder\n";
    (void)!::write(2, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  ::execve(argv[0], argv, envp);
  const char msg[] = "error: cannot execute ";
  (void)!::write(2, msg, sizeof(msg) - 1);
  (void)!::write(2, argv[0], std::strlen(argv[0]));
  (void)!::write(2, "\n", 1);
  ::_exit(127);
}

// Forks one rank into process group `pgid` (0: a new group led by it).
StatusOr<pid_t> SpawnRank(const RankCommand& cmd, pid_t pgid, const ParentDeathSignal* parent_death) {
  if (cmd.argv.empty()) return InvalidArgumentError("a rank command needs a program");
  if (::access(cmd.argv[0].c_str(), X_OK) != 0)
    return ErrnoError("trainer not executable", cmd.argv[0], errno);
  std::vector<std::string> args = cmd.argv, env = cmd.env;
  std::vector<char*> argv = CStrings(args), envp = CStrings(env);
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) ExecRank(cmd, argv.data(), envp.data(), pgid, launcher, parent_death);
  if (pid < 0) return ErrnoError("cannot start a rank of", cmd.argv[0], errno);
  // Set the group from this side too: whichever runs first wins, both agree. EACCES means the rank
  // already exec'd, having set it itself.
  (void)::setpgid(pid, pgid == 0 ? pid : pgid);
  return pid;
}

}  // namespace

std::vector<std::string> RankEnvironment(const RankEnv& env, const char* const* inherited) {
  std::vector<std::string> out;
  for (std::string& e : ChildEnvironment(ChildKind::kRank, inherited)) {  // the allowlist
    const bool keep_inherited_gpus = !env.cuda_visible_devices && e.rfind("CUDA_VISIBLE_DEVICES=", 0) == 0;
    if (!IsRankVariable(e.c_str()) || keep_inherited_gpus) out.push_back(std::move(e));
  }
  out.push_back("RANK=" + std::to_string(env.rank));
  out.push_back("WORLD_SIZE=" + std::to_string(env.world_size));
  out.push_back("LOCAL_RANK=" + std::to_string(env.local_rank));
  out.push_back("LOCAL_WORLD_SIZE=" + std::to_string(env.local_world_size));
  out.push_back("MASTER_ADDR=" + env.master_addr);
  out.push_back("MASTER_PORT=" + std::to_string(env.master_port));
  if (env.cuda_visible_devices) out.push_back("CUDA_VISIBLE_DEVICES=" + *env.cuda_visible_devices);
  return out;
}

StatusOr<int> OpenRankLog(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot open rank log", path, errno);
  const int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
  const int err = errno;
  ::close(fd);
  if (high < 0) return ErrnoError("cannot duplicate the descriptor of", path, err);
  return high;
}

Status OpenRankLogs(const std::string& stdout_path, const std::string& stderr_path,
                    const std::string& events_path, RankCommand* cmd) {
  int* targets[] = {&cmd->stdout_fd, &cmd->stderr_fd, &cmd->events_fd};
  const std::string* paths[] = {&stdout_path, &stderr_path, &events_path};
  for (int k = 0; k < 3; ++k) {
    StatusOr<int> fd = OpenRankLog(*paths[k]);
    if (!fd.ok()) {
      CloseRankLogs(cmd);
      return fd.status();
    }
    *targets[k] = *fd;
  }
  return OkStatus();
}

void CloseRankLogs(RankCommand* cmd) {
  for (int* fd : {&cmd->stdout_fd, &cmd->stderr_fd, &cmd->events_fd}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

StatusOr<std::vector<pid_t>> StartRankGroup(const std::vector<RankCommand>& cmds,
                                            const ParentDeathSignal* parent_death) {
  if (cmds.empty()) return InvalidArgumentError("a rank group needs at least one rank");
  std::vector<pid_t> pids;
  for (const RankCommand& cmd : cmds) {
    const pid_t pgid = pids.empty() ? 0 : pids.front();
    StatusOr<pid_t> pid = SpawnRank(cmd, pgid, parent_death);
    if (!pid.ok()) {
      if (!pids.empty()) ::killpg(pids.front(), SIGKILL);
      for (pid_t p : pids) {
        ::kill(p, SIGKILL);
        ::waitpid(p, nullptr, 0);
      }
      return pid.status().WithContext("starting rank " + std::to_string(pids.size()));
    }
    pids.push_back(*pid);
  }
  return pids;
}

RankExit RankExit::FromWaitStatus(int wstatus) {
  RankExit e;
  e.known = true;
  if (WIFEXITED(wstatus)) e.exit_code = WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) e.signal = WTERMSIG(wstatus);
  return e;
}

std::string RankExit::Describe() const {
  return known ? DescribeExit(exit_code, signal) : "exit status unknown";
}

std::string FirstFailureReason(const EndedRank& first, const std::string& trainer_error) {
  std::string why = "rank " + std::to_string(first.rank) + " failed first: " + first.exit.Describe();
  if (!trainer_error.empty()) why += " (trainer error: " + trainer_error + ")";
  return why;
}

std::optional<EndedRank> RankGroupStop::FirstFailure(const std::vector<EndedRank>& reaped) {
  if (first_failure_ || stopping()) return std::nullopt;
  const EndedRank* first = nullptr;
  for (const EndedRank& r : reaped) {
    if (!r.exit.failed()) continue;
    const bool by_signal = r.exit.signal != 0, first_by_signal = first != nullptr && first->exit.signal != 0;
    if (first == nullptr || (by_signal && !first_by_signal) ||
        (by_signal == first_by_signal && r.rank < first->rank))
      first = &r;
  }
  if (first == nullptr) return std::nullopt;
  first_failure_ = *first;
  return first_failure_;
}

bool RankGroupStop::Begin(Clock::TimePoint now) {
  if (stopping()) return false;
  phase_ = Phase::kTerminating;
  kill_at_ = now + kill_grace_;
  return true;
}

bool RankGroupStop::KillDue(Clock::TimePoint now) {
  if (phase_ != Phase::kTerminating || now < kill_at_) return false;
  phase_ = Phase::kKilled;
  return true;
}

std::chrono::milliseconds RankGroupStop::UntilKill(Clock::TimePoint now,
                                                   std::chrono::milliseconds cap) const {
  if (phase_ != Phase::kTerminating) return cap;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kill_at_ - now);
  return std::clamp(left, std::chrono::milliseconds(0), cap);
}

}  // namespace sftctl
