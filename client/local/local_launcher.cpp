#include "client/local/local_launcher.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "common/event_line.h"
#include "common/os/child_exit_watch.h"
#include "common/os/file_system.h"
#include "common/os/parent_death.h"
#include "common/os/process_util.h"
#include "common/rank_group.h"

namespace sftctl::client {
namespace {

constexpr int kMaxRanks = 1024;
constexpr size_t kErrTailLines = 10;

// Signal forwarding: the handler only reads these (async-signal-safe).
volatile sig_atomic_t g_nranks = 0;
volatile pid_t g_pids[kMaxRanks];
volatile sig_atomic_t g_signal = 0;

void ForwardToRanks(int sig) {
  g_signal = sig;
  for (int i = 0; i < g_nranks; ++i) {
    if (g_pids[i] > 0) ::kill(g_pids[i], sig);
  }
}

struct Rank {
  int rank = 0;
  pid_t pid = 0;
  bool alive = false;
  std::string err, events;    // log paths (ranks > 0)
  uint64_t events_start = 0;  // size of the events log before this launch
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
    auto ev = ParseEventLine(line, "trainer event");  // not an event line, or of the wrong shape: skipped
    if (ev.ok() && ev->type == EventKind::kError && !ev->message.empty()) msg = std::move(ev->message);
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

// One `run --local --ranks N` launch: the rank policy of common/rank_group.h, with this event loop:
// sleep on the exit watch, forward Ctrl-C (which begins the stop), report the first failure.
class LocalRankGroup {
 public:
  explicit LocalRankGroup(const LocalLaunchOptions& opts)
      : opts_(opts), ranks_(static_cast<size_t>(opts.ranks)), stop_(opts.kill_grace) {}
  ~LocalRankGroup() { RestoreSignals(); }

  // The log folder, the exit watch and the parent-death signal (both before the first fork: no exit
  // may be missed, and every rank can arm its parent-death signal), the rendezvous port, and signal
  // forwarding.
  Status Prepare();
  // Starts every rank (StartRankGroup kills the started ones if one cannot start).
  Status StartAll();
  // Waits until every rank has exited.
  LocalLaunchResult Supervise();

 private:
  StatusOr<RankCommand> Command(int rank);
  void Reap();
  void ReportFirstFailure(const EndedRank& first);
  void Escalate();
  void RestoreSignals();

  const LocalLaunchOptions& opts_;
  std::vector<Rank> ranks_;
  int port_ = 0;
  std::unique_ptr<ChildExitWatch> exits_;
  std::unique_ptr<ParentDeathSignal> parent_death_;
  bool forwarding_ = false;
  struct sigaction old_int_ {
  }, old_term_{};
  pid_t pgid_ = 0;

  LocalLaunchResult result_;
  size_t alive_ = 0;
  RankGroupStop stop_;
};

Status LocalRankGroup::Prepare() {
  SFT_RETURN_IF_ERROR(FileSystem::Default()->CreateDirs(opts_.log_dir));
  port_ = FreeTcpPort();
  SFT_ASSIGN_OR_RETURN(exits_, ChildExitWatch::Create());
  SFT_ASSIGN_OR_RETURN(parent_death_, ParentDeathSignal::Create(SIGTERM));
  g_nranks = 0;
  g_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = ForwardToRanks;
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

// Rank 0 shares the terminal and gets rank0_args; ranks > 0 write stdout, stderr and events to
// <log_dir>/rank-N.{out,err,events} (descriptors the caller closes: CloseRankLogs).
StatusOr<RankCommand> LocalRankGroup::Command(int rank) {
  Rank& r = ranks_[static_cast<size_t>(rank)];
  r.rank = rank;
  RankEnv env;
  env.rank = env.local_rank = rank;
  env.world_size = env.local_world_size = opts_.ranks;
  env.master_port = port_;  // CUDA_VISIBLE_DEVICES is inherited: rank r uses the r-th visible GPU
  RankCommand cmd;
  cmd.env = RankEnvironment(env);
  cmd.argv = {opts_.trainer};
  cmd.argv.insert(cmd.argv.end(), opts_.args.begin(), opts_.args.end());
  if (rank == 0) {
    cmd.argv.insert(cmd.argv.end(), opts_.rank0_args.begin(), opts_.rank0_args.end());
    return cmd;
  }
  cmd.argv.insert(cmd.argv.end(), {"--events-fd", "3"});
  const std::string stem = opts_.log_dir + "/rank-" + std::to_string(rank);
  r.err = stem + ".err";
  r.events = stem + ".events";
  r.err_start = FileSize(r.err);
  r.events_start = FileSize(r.events);
  SFT_RETURN_IF_ERROR(OpenRankLogs(stem + ".out", r.err, r.events, &cmd));
  return cmd;
}

Status LocalRankGroup::StartAll() {
  std::vector<RankCommand> cmds;
  Status st;
  for (int i = 0; st.ok() && i < opts_.ranks; ++i) {
    StatusOr<RankCommand> cmd = Command(i);
    if (cmd.ok()) cmds.push_back(std::move(*cmd));
    st = cmd.status();
  }
  StatusOr<std::vector<pid_t>> pids = st.ok() ? StartRankGroup(cmds, parent_death_.get()) : st;
  for (RankCommand& cmd : cmds) CloseRankLogs(&cmd);
  if (!pids.ok()) {
    RestoreSignals();
    return pids.status();
  }
  pgid_ = pids->front();
  for (size_t i = 0; i < pids->size(); ++i) {
    ranks_[i].pid = (*pids)[i];
    ranks_[i].alive = true;
    exits_->Watch(ranks_[i].pid);
    g_pids[i] = ranks_[i].pid;
  }
  g_nranks = static_cast<sig_atomic_t>(pids->size());
  alive_ = ranks_.size();
  // A Ctrl-C during the launch reached only the ranks started before it: forward it to all.
  if (g_signal != 0) ::killpg(pgid_, g_signal);
  return OkStatus();
}

// Reaps the ranks that exited; the first failure decides the result and begins the stop.
void LocalRankGroup::Reap() {
  std::vector<EndedRank> reaped;
  for (Rank& r : ranks_) {
    if (!r.alive) continue;
    int status = 0;
    pid_t got = ::waitpid(r.pid, &status, WNOHANG);
    if (got == 0 || (got < 0 && errno == EINTR)) continue;
    r.alive = false;
    g_pids[r.rank] = 0;
    exits_->Forget(r.pid);
    --alive_;
    if (got == r.pid) reaped.push_back({r.rank, RankExit::FromWaitStatus(status)});
  }
  if (std::optional<EndedRank> first = stop_.FirstFailure(reaped)) ReportFirstFailure(*first);
}

// Reports the first failure with the rank's error and log tail; the other ranks get SIGTERM.
void LocalRankGroup::ReportFirstFailure(const EndedRank& first) {
  const Rank& r = ranks_[static_cast<size_t>(first.rank)];
  result_.first_failed_rank = first.rank;
  result_.failure = FirstFailureReason(first, first.rank > 0 ? LastErrorEvent(r.events, r.events_start) : "");
  result_.exit_code = first.exit.ShellCode();
  std::cerr << "\nerror: " << result_.failure;
  if (alive_ > 0) std::cerr << "; stopping the other " << alive_ << " rank(s)";
  std::cerr << std::endl;
  if (first.rank > 0) {
    for (const std::string& line : TailLines(r.err, r.err_start, kErrTailLines))
      std::cerr << "[rank " << first.rank << "] " << line << "\n";
    std::cerr << "(rank " << first.rank << " logs: " << opts_.log_dir << "/rank-" << first.rank
              << ".{out,err})" << std::endl;
  }
  if (stop_.Begin(Clock::Real()->Now()) && alive_ > 0) ::killpg(pgid_, SIGTERM);
}

// SIGKILL for whatever of the group is still running kill_grace after the stop began.
void LocalRankGroup::Escalate() {
  if (alive_ == 0 || !stop_.KillDue(Clock::Real()->Now())) return;
  std::cerr << "error: " << alive_ << " rank(s) still running " << opts_.kill_grace.count()
            << " ms after the stop began; sending SIGKILL" << std::endl;
  ::killpg(pgid_, SIGKILL);
}

LocalLaunchResult LocalRankGroup::Supervise() {
  while (alive_ > 0) {
    exits_->Wait(
        static_cast<int>(stop_.UntilKill(Clock::Real()->Now(), std::chrono::milliseconds(100)).count()));
    // The user's Ctrl-C (already forwarded by the handler) begins the stop: ranks it ends did not
    // fail on their own, and those still running after the grace period are killed.
    if (g_signal != 0) stop_.Begin(Clock::Real()->Now());
    Reap();
    Escalate();
  }
  if (result_.first_failed_rank < 0 && g_signal != 0) result_.exit_code = 128 + g_signal;
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
