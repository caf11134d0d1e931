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

// One `run --local --ranks N` launch: starts the ranks in one process group, forwards Ctrl-C to
// them, and supervises them until all have exited (the first failure stops the others: SIGTERM,
// then SIGKILL after opts.kill_grace).
class LocalRankGroup {
 public:
  explicit LocalRankGroup(const LocalLaunchOptions& opts)
      : opts_(opts), ranks_(static_cast<size_t>(opts.ranks)) {}
  ~LocalRankGroup() { RestoreSignals(); }

  // The log folder, the exit watch and the parent-death signal (both before the first fork: no exit
  // may be missed, and every rank can arm its parent-death signal), the rendezvous port, and signal
  // forwarding.
  Status Prepare();
  // Forks every rank; on failure kills the ranks already started.
  Status StartAll();
  // Waits until every rank has exited.
  LocalLaunchResult Supervise();

 private:
  StatusOr<std::vector<int>> OpenRankLogs(Rank& r);
  std::vector<std::string> RankEnv(int rank) const;
  Status StartRank(int i);
  void ReapExited(std::vector<Rank*>* failed_now);
  void ReportFirstFailure(const std::vector<Rank*>& failed_now);
  void EscalateIfDue();
  void KillStarted();
  void RestoreSignals();

  const LocalLaunchOptions& opts_;
  std::vector<Rank> ranks_;
  std::vector<std::string> base_env_;  // ours minus the variables each rank gets its own value of
  int port_ = 0;
  std::unique_ptr<ChildExitWatch> exits_;
  std::unique_ptr<ParentDeathSignal> parent_death_;
  bool forwarding_ = false;
  struct sigaction old_int_ {
  }, old_term_{};
  pid_t pgid_ = 0;

  LocalLaunchResult result_;
  size_t alive_ = 0;
  bool stopping_ = false, sigkilled_ = false;
  Clock::time_point kill_at_{};
};

Status LocalRankGroup::Prepare() {
  SFT_RETURN_IF_ERROR(FileSystem::Default()->CreateDirs(opts_.log_dir));
  port_ = FreeTcpPort();
  static const char* kOwn[] = {"RANK",        "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                               "MASTER_ADDR", "MASTER_PORT"};
  for (char** e = environ; e && *e; ++e) {
    bool own = false;
    for (const char* k : kOwn) {
      size_t n = std::strlen(k);
      own |= std::strncmp(*e, k, n) == 0 && (*e)[n] == '=';
    }
    if (!own) base_env_.emplace_back(*e);
  }
  SFT_ASSIGN_OR_RETURN(exits_, ChildExitWatch::Create());
  SFT_ASSIGN_OR_RETURN(parent_death_, ParentDeathSignal::Create(SIGTERM));
  g_nranks = 0;
  g_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = Forward;
  sigemptyset(&sa.sa_mask);  // no "::": a macro on macOS
  sa.sa_flags = 0;           // no SA_RESTART: the exit wait returns early and the loop notices
  ::sigaction(SIGINT, &sa, &old_int_);
  ::sigaction(SIGTERM, &sa, &old_term_);
  forwarding_ = true;
  return OkStatus();
}

void LocalRankGroup::RestoreSignals() {
  if (!forwarding_) return;
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
  g_nranks = 0;
  forwarding_ = false;
}

void LocalRankGroup::KillStarted() {
  for (Rank& r : ranks_) {
    if (r.pid > 0 && r.alive) {
      ::kill(r.pid, SIGKILL);
      ::waitpid(r.pid, nullptr, 0);
    }
  }
  if (pgid_ > 0) ::killpg(pgid_, SIGKILL);
  RestoreSignals();
}

// Ranks > 0 write stdout, stderr and events to <log_dir>/rank-N.{out,err,events} (fds for 1, 2, 3).
StatusOr<std::vector<int>> LocalRankGroup::OpenRankLogs(Rank& r) {
  const std::string stem = opts_.log_dir + "/rank-" + std::to_string(r.rank);
  r.out = stem + ".out";
  r.err = stem + ".err";
  r.events = stem + ".events";
  r.err_start = FileSize(r.err);
  r.events_start = FileSize(r.events);
  std::vector<int> fds;
  for (const std::string* path : {&r.out, &r.err, &r.events}) {
    auto fd = OpenLog(*path);
    if (!fd.ok()) {
      for (int f : fds) ::close(f);
      return fd.status();
    }
    fds.push_back(*fd);
  }
  return fds;
}

std::vector<std::string> LocalRankGroup::RankEnv(int rank) const {
  std::vector<std::string> env = base_env_;
  env.push_back("RANK=" + std::to_string(rank));
  env.push_back("WORLD_SIZE=" + std::to_string(opts_.ranks));
  env.push_back("LOCAL_RANK=" + std::to_string(rank));
  env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(opts_.ranks));
  env.push_back("MASTER_ADDR=127.0.0.1");
  env.push_back("MASTER_PORT=" + std::to_string(port_));
  return env;
}

Status LocalRankGroup::StartAll() {
  for (int i = 0; i < opts_.ranks; ++i) {
    Status s = StartRank(i);
    if (!s.ok()) {
      KillStarted();
      return s;
    }
  }
  alive_ = ranks_.size();
  return OkStatus();
}

Status LocalRankGroup::StartRank(int i) {
  Rank& r = ranks_[static_cast<size_t>(i)];
  r.rank = i;
  std::vector<std::string> args = {opts_.trainer};
  args.insert(args.end(), opts_.args.begin(), opts_.args.end());
  std::vector<int> fds;
  if (i == 0) {
    args.insert(args.end(), opts_.rank0_args.begin(), opts_.rank0_args.end());
  } else {
    SFT_ASSIGN_OR_RETURN(fds, OpenRankLogs(r));
    args.insert(args.end(), {"--events-fd", "3"});
  }
  std::vector<std::string> env = RankEnv(i);
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pgid = pgid_;
  pid_t pid = ::fork();
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    ::setpgid(0, pgid);
    (void)parent_death_->ArmInChild();
    if (::getppid() != parent) ::_exit(127);  // sftctl already died
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    if (!fds.empty()) {
      int null_fd = ::open("/dev/null", O_RDONLY);
      if (null_fd >= 0) ::dup2(null_fd, 0);
      for (int k = 0; k < 3; ++k) ::dup2(fds[static_cast<size_t>(k)], k + 1);
    }
    ::execve(argv[0], argv.data(), envp.data());
    const char msg[] = "error: cannot execute the trainer\n";
    (void)!::write(2, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  const int fork_errno = errno;
  for (int f : fds) ::close(f);
  if (pid < 0) return ErrnoError("cannot start rank " + std::to_string(i) + " of", opts_.trainer, fork_errno);
  // Parent: set the group too (whichever runs first wins the race; both agree). EACCES means the
  // child already exec'd, having set it itself.
  (void)::setpgid(pid, pgid_ == 0 ? pid : pgid_);
  if (pgid_ == 0) pgid_ = pid;
  r.pid = pid;
  r.alive = true;
  exits_->Watch(pid);
  g_pids[i] = pid;
  g_nranks = i + 1;
  if (g_signal != 0) ::kill(pid, g_signal);  // a Ctrl-C during the launch reaches late ranks too
  return OkStatus();
}

// Reaps the ranks that exited; those that failed on their own (not by the user's Ctrl-C) go to
// `failed_now`.
void LocalRankGroup::ReapExited(std::vector<Rank*>* failed_now) {
  for (Rank& r : ranks_) {
    if (!r.alive) continue;
    int status = 0;
    pid_t got = ::waitpid(r.pid, &status, WNOHANG);
    if (got == 0 || (got < 0 && errno == EINTR)) continue;
    r.alive = false;
    r.status = got == r.pid ? status : 0;
    g_pids[r.rank] = 0;
    exits_->Forget(r.pid);
    --alive_;
    // A rank ended by the signal the user sent (Ctrl-C) did not fail on its own.
    const bool by_user = g_signal != 0 && WIFSIGNALED(status) && WTERMSIG(status) == g_signal;
    if (got == r.pid && Failed(status) && !by_user) failed_now->push_back(&r);
    if (got == r.pid && by_user && result_.exit_code == 0) result_.exit_code = 128 + g_signal;
  }
}

// The first failure decides the result and is reported with the rank's error and log tail; the
// other ranks get SIGTERM.
void LocalRankGroup::ReportFirstFailure(const std::vector<Rank*>& failed_now) {
  // Reaped together: a rank killed by a signal beats one that exited with an error code.
  Rank* first = failed_now.front();
  for (Rank* r : failed_now) {
    if (WIFSIGNALED(r->status) && !WIFSIGNALED(first->status)) first = r;
  }
  result_.first_failed_rank = first->rank;
  result_.failure = "rank " + std::to_string(first->rank) + " failed first: " + HowEnded(first->status);
  result_.exit_code = WIFSIGNALED(first->status) ? 128 + WTERMSIG(first->status) : WEXITSTATUS(first->status);
  if (first->rank > 0) {
    std::string msg = LastErrorEvent(first->events, first->events_start);
    if (!msg.empty()) result_.failure += " (trainer error: " + msg + ")";
  }
  std::cerr << "\nerror: " << result_.failure;
  if (alive_ > 0 && g_signal == 0) std::cerr << "; stopping the other " << alive_ << " rank(s)";
  std::cerr << std::endl;
  if (first->rank > 0) {
    for (const std::string& line : TailLines(first->err, first->err_start, kErrTailLines))
      std::cerr << "[rank " << first->rank << "] " << line << "\n";
    std::cerr << "(rank " << first->rank << " logs: " << opts_.log_dir << "/rank-" << first->rank
              << ".{out,err})" << std::endl;
  }
  if (!stopping_ && alive_ > 0) {
    stopping_ = true;
    kill_at_ = Clock::now() + opts_.kill_grace;
    for (const Rank& r : ranks_) {
      if (r.alive) ::kill(r.pid, SIGTERM);
    }
  }
}

// SIGKILL for the ranks still running kill_grace after SIGTERM.
void LocalRankGroup::EscalateIfDue() {
  if (!stopping_ || sigkilled_ || alive_ == 0 || Clock::now() < kill_at_) return;
  std::cerr << "error: " << alive_ << " rank(s) still running " << opts_.kill_grace.count()
            << " ms after SIGTERM; sending SIGKILL" << std::endl;
  ::killpg(pgid_, SIGKILL);
  for (const Rank& r : ranks_) {
    if (r.alive) ::kill(r.pid, SIGKILL);
  }
  sigkilled_ = true;
}

LocalLaunchResult LocalRankGroup::Supervise() {
  while (alive_ > 0) {
    int timeout_ms = 100;
    if (stopping_ && !sigkilled_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kill_at_ - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<long long>(left, 0, 100));
    }
    exits_->Wait(timeout_ms);  // EINTR (a forwarded signal) just loops
    std::vector<Rank*> failed_now;
    ReapExited(&failed_now);
    if (result_.first_failed_rank < 0 && !failed_now.empty()) ReportFirstFailure(failed_now);
    EscalateIfDue();
  }
  RestoreSignals();
  return result_;
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
  LocalRankGroup group(opts);
  SFT_RETURN_IF_ERROR(group.Prepare());
  SFT_RETURN_IF_ERROR(group.StartAll());
  return group.Supervise();
}

}  // namespace sftctl::client
