#include "client/local_launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/child_exit_watch.h"
#include "common/file_system.h"
#include "common/parent_death.h"
#include "common/process_util.h"

extern char** environ;

namespace sftctl::client {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxRanks = 1024;
constexpr size_t kErrTailLines = 10;

// Signal forwarding: the handler only reads these (async-signal-safe).
volatile sig_atomic_t g_nranks = 0;
volatile pid_t g_pids[kMaxRanks];
volatile sig_atomic_t g_signal = 0;

void Forward(int sig) {
  g_signal = sig;
  for (int i = 0; i < g_nranks; ++i) {
    if (g_pids[i] > 0) ::kill(g_pids[i], sig);
  }
}

std::string HowEnded(int status) {
  return DescribeExit(WIFEXITED(status) ? WEXITSTATUS(status) : 0,
                      WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

bool Failed(int status) { return WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0); }

struct Rank {
  int rank = 0;
  pid_t pid = 0;
  bool alive = false;
  int status = 0;
  std::string out, err, events;  // log paths (ranks > 0)
  uint64_t events_start = 0;     // size of the events log before this launch
  uint64_t err_start = 0;
};

uint64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// The message of the last "error" event written since `from`, "" if none.
std::string LastErrorEvent(const std::string& path, uint64_t from) {
  std::ifstream f(path);
  if (!f) return "";
  f.seekg(static_cast<std::streamoff>(from));
  std::string line, msg;
  while (std::getline(f, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("event", "") == "error" && j.contains("message") && j["message"].is_string())
      msg = j["message"].get<std::string>();
  }
  return msg;
}

// The last `n` lines written to `path` since `from`.
std::vector<std::string> TailLines(const std::string& path, uint64_t from, size_t n) {
  std::ifstream f(path);
  std::vector<std::string> lines;
  if (!f) return lines;
  f.seekg(static_cast<std::streamoff>(from));
  std::string line;
  while (std::getline(f, line)) {
    lines.push_back(line);
    if (lines.size() > n) lines.erase(lines.begin());
  }
  return lines;
}

// Opens `path` for appending at fd >= 10 (so dup2 onto 0..3 in the child never clobbers it).
StatusOr<int> OpenLog(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot open rank log", path, errno);
  int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
  int err = errno;
  ::close(fd);
  if (high < 0) return ErrnoError("cannot duplicate descriptor of", path, err);
  return high;
}

}  // namespace

int CountNvidiaGpus() {
  FILE* p = ::popen("nvidia-smi -L 2>/dev/null", "r");
  if (p == nullptr) return 0;
  int n = 0;
  char line[512];
  while (std::fgets(line, sizeof(line), p) != nullptr) n += std::strncmp(line, "GPU ", 4) == 0;
  int rc = ::pclose(p);
  return rc == 0 ? n : 0;
}

StatusOr<LocalLaunchResult> LaunchLocalRanks(const LocalLaunchOptions& opts) {
  if (opts.ranks < 2 || opts.ranks > kMaxRanks) {
    return InvalidArgumentError("--ranks: " + std::to_string(opts.ranks) + " must be between 2 and " +
                                std::to_string(kMaxRanks) + " for a multi-rank launch");
  }
  SFT_RETURN_IF_ERROR(FileSystem::Default()->CreateDirs(opts.log_dir));
  const int port = FreeTcpPort();

  // Environment: ours minus the variables each rank gets its own value of.
  static const char* kOwn[] = {"RANK",        "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                               "MASTER_ADDR", "MASTER_PORT"};
  std::vector<std::string> base_env;
  for (char** e = environ; e && *e; ++e) {
    bool own = false;
    for (const char* k : kOwn) {
      size_t n = std::strlen(k);
      own |= std::strncmp(*e, k, n) == 0 && (*e)[n] == '=';
    }
    if (!own) base_env.emplace_back(*e);
  }

  std::vector<Rank> ranks(static_cast<size_t>(opts.ranks));
  // Both before the first fork: no exit may be missed, and every rank can arm its parent-death signal.
  SFT_ASSIGN_OR_RETURN(std::unique_ptr<ChildExitWatch> exits, ChildExitWatch::Create());
  SFT_ASSIGN_OR_RETURN(std::unique_ptr<ParentDeathSignal> parent_death, ParentDeathSignal::Create(SIGTERM));
  g_nranks = 0;
  g_signal = 0;
  struct sigaction sa {
  }, old_int{}, old_term{};
  sa.sa_handler = Forward;
  sigemptyset(&sa.sa_mask);  // no "::": a macro on macOS
  sa.sa_flags = 0;           // no SA_RESTART: the exit wait returns early and the loop notices
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  auto restore = [&] {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
    g_nranks = 0;
  };
  pid_t pgid = 0;
  auto kill_started = [&] {
    for (Rank& r : ranks) {
      if (r.pid > 0 && r.alive) {
        ::kill(r.pid, SIGKILL);
        ::waitpid(r.pid, nullptr, 0);
      }
    }
    if (pgid > 0) ::killpg(pgid, SIGKILL);
    restore();
  };

  for (int i = 0; i < opts.ranks; ++i) {
    Rank& r = ranks[static_cast<size_t>(i)];
    r.rank = i;
    std::vector<std::string> args = {opts.trainer};
    args.insert(args.end(), opts.args.begin(), opts.args.end());
    int fds[3] = {-1, -1, -1};
    if (i == 0) {
      args.insert(args.end(), opts.rank0_args.begin(), opts.rank0_args.end());
    } else {
      r.out = opts.log_dir + "/rank-" + std::to_string(i) + ".out";
      r.err = opts.log_dir + "/rank-" + std::to_string(i) + ".err";
      r.events = opts.log_dir + "/rank-" + std::to_string(i) + ".events";
      r.err_start = FileSize(r.err);
      r.events_start = FileSize(r.events);
      const std::string* paths[3] = {&r.out, &r.err, &r.events};
      for (int k = 0; k < 3; ++k) {
        auto fd = OpenLog(*paths[k]);
        if (!fd.ok()) {
          for (int& f : fds) {
            if (f >= 0) ::close(f);
          }
          kill_started();
          return fd.status();
        }
        fds[k] = *fd;
      }
      args.insert(args.end(), {"--events-fd", "3"});
    }
    std::vector<std::string> env = base_env;
    env.push_back("RANK=" + std::to_string(i));
    env.push_back("WORLD_SIZE=" + std::to_string(opts.ranks));
    env.push_back("LOCAL_RANK=" + std::to_string(i));
    env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(opts.ranks));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back("MASTER_PORT=" + std::to_string(port));
    std::vector<char*> argv, envp;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) {
      int err = errno;
      for (int& f : fds) {
        if (f >= 0) ::close(f);
      }
      kill_started();
      return ErrnoError("cannot start rank " + std::to_string(i) + " of", opts.trainer, err);
    }
    if (pid == 0) {
      // Child: only async-signal-safe calls until exec.
      ::setpgid(0, pgid);
      (void)parent_death->ArmInChild();
      if (::getppid() != parent) ::_exit(127);  // sftctl already died
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      if (i > 0) {
        int null_fd = ::open("/dev/null", O_RDONLY);
        if (null_fd >= 0) ::dup2(null_fd, 0);
        ::dup2(fds[0], 1);
        ::dup2(fds[1], 2);
        ::dup2(fds[2], 3);
      }
      ::execve(argv[0], argv.data(), envp.data());
      const char msg[] = "error: cannot execute the trainer\n";
      (void)!::write(2, msg, sizeof(msg) - 1);
      ::_exit(127);
    }
    // Parent: set the group too (whichever runs first wins the race; both agree). EACCES means the
    // child already exec'd, having set it itself.
    (void)::setpgid(pid, pgid == 0 ? pid : pgid);
    if (pgid == 0) pgid = pid;
    for (int& f : fds) {
      if (f >= 0) ::close(f);
    }
    r.pid = pid;
    r.alive = true;
    exits->Watch(pid);
    g_pids[i] = pid;
    g_nranks = i + 1;
    if (g_signal != 0) ::kill(pid, g_signal);  // a Ctrl-C during the launch reaches late ranks too
  }

  LocalLaunchResult result;
  bool stopping = false;
  bool sigkilled = false;
  Clock::time_point kill_at{};
  size_t alive = ranks.size();
  while (alive > 0) {
    int timeout_ms = 100;
    if (stopping && !sigkilled) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kill_at - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<long long>(left, 0, 100));
    }
    exits->Wait(timeout_ms);  // EINTR (a forwarded signal) just loops
    std::vector<Rank*> failed_now;
    for (Rank& r : ranks) {
      if (!r.alive) continue;
      int status = 0;
      pid_t got = ::waitpid(r.pid, &status, WNOHANG);
      if (got == 0 || (got < 0 && errno == EINTR)) continue;
      r.alive = false;
      r.status = got == r.pid ? status : 0;
      g_pids[r.rank] = 0;
      exits->Forget(r.pid);
      --alive;
      // A rank ended by the signal the user sent (Ctrl-C) did not fail on its own.
      const bool by_user = g_signal != 0 && WIFSIGNALED(status) && WTERMSIG(status) == g_signal;
      if (got == r.pid && Failed(status) && !by_user) failed_now.push_back(&r);
      if (got == r.pid && by_user && result.exit_code == 0) result.exit_code = 128 + g_signal;
    }
    if (result.first_failed_rank < 0 && !failed_now.empty()) {
      // Reaped together: a rank killed by a signal beats one that exited with an error code.
      Rank* first = failed_now.front();
      for (Rank* r : failed_now) {
        if (WIFSIGNALED(r->status) && !WIFSIGNALED(first->status)) first = r;
      }
      result.first_failed_rank = first->rank;
      result.failure = "rank " + std::to_string(first->rank) + " failed first: " + HowEnded(first->status);
      result.exit_code =
          WIFSIGNALED(first->status) ? 128 + WTERMSIG(first->status) : WEXITSTATUS(first->status);
      if (first->rank > 0) {
        std::string msg = LastErrorEvent(first->events, first->events_start);
        if (!msg.empty()) result.failure += " (trainer error: " + msg + ")";
      }
      std::cerr << "\nerror: " << result.failure;
      if (alive > 0 && g_signal == 0) std::cerr << "; stopping the other " << alive << " rank(s)";
      std::cerr << std::endl;
      if (first->rank > 0) {
        for (const std::string& line : TailLines(first->err, first->err_start, kErrTailLines))
          std::cerr << "[rank " << first->rank << "] " << line << "\n";
        std::cerr << "(rank " << first->rank << " logs: " << opts.log_dir << "/rank-" << first->rank
                  << ".{out,err})" << std::endl;
      }
      if (!stopping && alive > 0) {
        stopping = true;
        kill_at = Clock::now() + opts.kill_grace;
        for (const Rank& r : ranks) {
          if (r.alive) ::kill(r.pid, SIGTERM);
        }
      }
    }
    if (stopping && !sigkilled && alive > 0 && Clock::now() >= kill_at) {
      std::cerr << "error: " << alive << " rank(s) still running " << opts.kill_grace.count()
                << " ms after SIGTERM; sending SIGKILL" << std::endl;
      ::killpg(pgid, SIGKILL);
      for (const Rank& r : ranks) {
        if (r.alive) ::kill(r.pid, SIGKILL);
      }
      sigkilled = true;
    }
  }
  restore();
  return result;
}

}  // namespace sftctl::client
