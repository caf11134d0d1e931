// Launcher: starts trainer ranks and inspects processes (no state; used by the Supervisor). The launch
// policy itself (environment, one process group, first failure, stop) is common/rank_group.h.
//
// Rank stdout, stderr and the trainer's event stream (fd 3) go to
// append-only files under <job_dir>/logs, not pipes: the ranks keep running, and nothing is lost, while
// the agent itself restarts; the supervisor tails the files.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/rank_group.h"
#include "common/status.h"

namespace sftctl::agent {

struct SpawnedRank {
  int rank = 0;
  pid_t pid = 0;
  uint64_t start_time = 0;
};

// Output file of a rank: src 0 = stdout, 1 = stderr, 2 = events (fd 3).
std::string RankFile(const std::string& job_dir, int rank, int src);

// Starts one rank per entry of `envs` (common/rank_group.h: one new process group, led by the first
// rank), each running `trainer train --spec <job_dir>/spec.json --events-fd 3` in job_dir with
// stdout, stderr and fd 3 appended to its RankFile()s. Every rank of a GPU job sees all of the job's
// GPUs (so cuda:LOCAL_RANK is its own and NCCL can use peer access). The ranks do not die with the
// agent. Errors: the log file or the trainer named (the ranks already started are killed and reaped).
StatusOr<std::vector<SpawnedRank>> StartJobRanks(const std::string& trainer, const std::string& job_dir,
                                                 const std::vector<RankEnv>& envs);

struct ProcStat {
  char state = '?';
  pid_t pgid = 0;
  uint64_t start_time = 0;  // field 22, clock ticks since boot
};
// Reads /proc/<pid>/stat; nullopt when there is no such process.
std::optional<ProcStat> ReadProcStat(pid_t pid);
// True when `pid` is alive (not a zombie) and started at `start_time`.
bool SameProcessAlive(pid_t pid, uint64_t start_time);
// Pids of every live (non-zombie) process in process group `pgid`.
std::vector<pid_t> ProcessGroupMembers(pid_t pgid);

}  // namespace sftctl::agent
