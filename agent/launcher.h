// Launcher: starts trainer ranks and inspects processes (no state; used by the Supervisor).
//
// Each job's ranks share one process group (the group of rank 0), so a single killpg() reaches every
// rank and every process they spawn. Rank stdout, stderr and the trainer's event stream (fd 3) go to
// append-only files under <job_dir>/logs, not pipes: the ranks keep running, and nothing is lost, while
// the agent itself restarts; the supervisor tails the files.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl::agent {

// The torch.distributed environment of one rank (the trainer reads these; see docs/agent.md).
// `rank` is the global rank and also names the rank's log files (logs/rank-<rank>.*).
struct RankEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // Every rank of a GPU job sees all of the job's GPUs (so cuda:LOCAL_RANK is its own GPU and NCCL
  // can use peer access); empty: CUDA_VISIBLE_DEVICES="" (no GPU).
  std::string cuda_visible_devices;
};

struct SpawnedRank {
  pid_t pid = 0;
  uint64_t start_time = 0;
};

// Output file of a rank: src 0 = stdout, 1 = stderr, 2 = events (fd 3).
std::string RankFile(const std::string& job_dir, int rank, int src);

// Runs `trainer train --spec <job_dir>/spec.json --events-fd 3` with cwd = job_dir in process group
// `pgid` (0: a new group led by this rank). Errors: INTERNAL / NOT_FOUND naming the trainer path.
StatusOr<SpawnedRank> SpawnRank(const std::string& trainer, const std::string& job_dir, const RankEnv& env,
                                pid_t pgid);

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
