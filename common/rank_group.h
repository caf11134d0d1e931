// The launch policy for the trainer ranks of one job on one host, in one place. Two launchers use
// it: the agent's supervisor (agent/jobs/supervisor.cpp, ranks that outlive an agent restart) and
// `sftctl run --local --ranks N` (client/local/local_launcher.cpp, ranks that die with sftctl). Each keeps
// only its own event loop: how it learns that a rank exited, when it wakes, what it tells the user.
//
// The policy:
//   * Environment (RankEnvironment): torch.distributed's variables RANK, WORLD_SIZE, LOCAL_RANK,
//     LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and CUDA_VISIBLE_DEVICES when the launcher assigns
//     GPUs, replace any inherited value; of the others, only those the allowlist of
//     common/os/process_util.h passes (ChildEnvAllowed(name, ChildKind::kRank)) are inherited, so no
//     secret of the launcher's (HF_TOKEN, cloud API keys) reaches a rank.
//   * Start (StartRankGroup): every rank of a job in one new process group, led by the first rank,
//     so one killpg() reaches every rank and whatever it spawned. A rank's stdout, stderr and fd 3
//     (the trainer's event stream) are append-only log files the launcher opened (OpenRankLog), or
//     inherited. Signal dispositions and the signal mask are reset to the defaults in the rank.
//   * First failure (RankGroupStop::FirstFailure): the first rank to exit non-zero or by a signal
//     fails the job. Of ranks reaped in the same pass, one killed by a signal counts first (the peers
//     of a dead rank exit with an error code), then the lowest rank. Only while no stop has begun:
//     ranks ended by a stop (a cancel, a Ctrl-C, the SIGTERM below) did not fail on their own.
//   * Stop (RankGroupStop): SIGTERM to the group when the stop begins, SIGKILL once `kill_grace`
//     has passed, each sent once; the launcher waits until nothing of the group is left.
//
// Thread safety: the free functions are thread-safe. RankGroupStop is not (one event loop owns it).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/os/clock.h"
#include "common/status.h"

namespace sftctl {

class ParentDeathSignal;

// The torch.distributed environment of one rank (docs/agent.md lists what the trainer reads).
struct RankEnv {
  int rank = 0;  // global rank
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // Set: CUDA_VISIBLE_DEVICES gets this value ("" hides every GPU). Unset: inherited.
  std::optional<std::string> cuda_visible_devices;
};

// `inherited` (NAME=value strings, null-terminated; nullptr: this process's environ) as the allowlist
// passes it, minus the variables above, plus their values for `env`.
std::vector<std::string> RankEnvironment(const RankEnv& env, const char* const* inherited = nullptr);

// Opens `path` for appending (created 0644 if missing) at a descriptor >= 10, close-on-exec, so that
// moving it onto 1..3 in the rank never clobbers another. The caller closes it once the rank started.
// Errors: the errno error naming the path.
StatusOr<int> OpenRankLog(const std::string& path);

// One rank's process.
struct RankCommand {
  std::vector<std::string> argv;  // argv[0]: the program's path (not searched in PATH)
  std::vector<std::string> env;   // the whole environment, e.g. RankEnvironment(...)
  std::string cwd;                // "" keeps the launcher's
  // Descriptors (>= 10, from OpenRankLog) that become the rank's stdout, stderr and fd 3, with
  // stdin from /dev/null; all -1: the rank inherits the launcher's stdin, stdout and stderr.
  int stdout_fd = -1;
  int stderr_fd = -1;
  int events_fd = -1;
};

// Opens the rank's three logs (OpenRankLog) as cmd's stdout, stderr and events descriptors; on an
// error, those already opened are closed again. The caller closes them (CloseRankLogs) once the
// group started or failed to.
Status OpenRankLogs(const std::string& stdout_path, const std::string& stderr_path,
                    const std::string& events_path, RankCommand* cmd);
// Closes the log descriptors of `cmd` that are open and marks them closed (-1).
void CloseRankLogs(RankCommand* cmd);

// Starts `cmds` (at least one) in one new process group led by the first; `parent_death`
// (optional) is armed in each rank (common/os/parent_death.h), which then exits 127 at once if the
// launcher already died. The launcher keeps its descriptors. Returns the pids in the order of `cmds`.
// A rank whose program cannot be executed exits 127 after writing "error: cannot execute <path>" to
// its stderr. Errors: NOT_FOUND / PERMISSION_DENIED naming the program when it is not executable,
// or the fork error; the ranks already started are then killed (SIGKILL) and reaped.
StatusOr<std::vector<pid_t>> StartRankGroup(const std::vector<RankCommand>& cmds,
                                            const ParentDeathSignal* parent_death = nullptr);

// How a rank ended.
struct RankExit {
  bool known = false;  // false: not our child (re-attached after an agent restart), so unknowable
  int exit_code = 0;
  int signal = 0;  // != 0: killed by this signal

  static RankExit FromWaitStatus(int wstatus);
  bool failed() const { return known && (signal != 0 || exit_code != 0); }
  // What a shell reports: 128 + the signal, or the exit code.
  int ShellCode() const { return signal != 0 ? 128 + signal : exit_code; }
  // "exit code 1", "killed by signal 9 (SIGKILL)"; "exit status unknown" when not known.
  std::string Describe() const;
};

struct EndedRank {
  int rank = 0;
  RankExit exit;
};

// "rank 1 failed first: killed by signal 9 (SIGKILL)", plus " (trainer error: <msg>)" when the rank
// reported an error event.
std::string FirstFailureReason(const EndedRank& first, const std::string& trainer_error);

// The stop state of one group: Running -> Terminating (SIGTERM sent) -> Killed (SIGKILL sent), and
// the group's first failure. Time comes from the caller (a Clock), so tests need no sleeps.
class RankGroupStop {
 public:
  enum class Phase { kRunning, kTerminating, kKilled };

  explicit RankGroupStop(std::chrono::milliseconds kill_grace) : kill_grace_(kill_grace) {}

  // Records the ranks reaped in one pass of the launcher's loop. Returns the rank that failed first
  // when this pass decided it (see the policy above); the caller then begins the stop. Later passes
  // never replace it.
  std::optional<EndedRank> FirstFailure(const std::vector<EndedRank>& reaped);
  // Begins the stop. True only for the call that began it: the caller sends SIGTERM now.
  bool Begin(Clock::TimePoint now);
  // True once, when the grace period has passed since Begin: the caller sends SIGKILL now.
  bool KillDue(Clock::TimePoint now);
  // How long the loop may sleep before KillDue has something to do, at most `cap`.
  std::chrono::milliseconds UntilKill(Clock::TimePoint now, std::chrono::milliseconds cap) const;

  Phase phase() const { return phase_; }
  bool stopping() const { return phase_ != Phase::kRunning; }
  const std::optional<EndedRank>& first_failure() const { return first_failure_; }

 private:
  std::chrono::milliseconds kill_grace_;
  Phase phase_ = Phase::kRunning;
  Clock::TimePoint kill_at_{};
  std::optional<EndedRank> first_failure_;
};

}  // namespace sftctl
