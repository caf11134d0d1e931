// LocalLauncher: the ranks of one multi-rank job on this machine (`sftctl run --local --ranks N`).
//
// Contract (the launch policy itself, shared with the agent, is common/rank_group.h):
//   * Starts N processes `trainer ARGS...` (N >= 2; a single rank is RunChild's job, unchanged) with the
//     torch.distributed environment RANK=r, WORLD_SIZE=N, LOCAL_RANK=r, LOCAL_WORLD_SIZE=N,
//     MASTER_ADDR=127.0.0.1, MASTER_PORT=<a port free on 127.0.0.1>. CUDA_VISIBLE_DEVICES is inherited, so
//     rank r uses the r-th visible GPU.
//   * Rank 0 shares the terminal (its progress bar and errors) and gets `rank0_args` appended (e.g. the
//     user's --events-fd). Ranks r > 0 get stdin from /dev/null, stdout and stderr appended to
//     <log_dir>/rank-<r>.out and .err, and `--events-fd 3` with fd 3 appended to <log_dir>/rank-<r>.events.
//   * The ranks form their own process group (led by rank 0), so the terminal's Ctrl-C reaches only
//     sftctl, which forwards SIGINT/SIGTERM once to every rank. Every rank gets SIGTERM if sftctl dies
//     (common/os/parent_death.h: PR_SET_PDEATHSIG on Linux; on macOS a small watcher process per rank).
//   * The first failure (common/rank_group.h: ranks reaped together, one killed by a signal first,
//     then the lowest rank) fails the job: a line "error: rank 1 failed first: killed by signal 9
//     (SIGKILL)" (or "exit code 1", plus the rank's "error" event message when it has one) goes to
//     stderr, followed for ranks > 0 by the last lines of its stderr log prefixed "[rank r] ". The
//     group gets SIGTERM. A forwarded Ctrl-C also begins the stop (ranks it ends did not fail on their
//     own). Whatever still runs `kill_grace` after the stop began gets SIGKILL. Launch returns once
//     every rank is reaped.
//
// Not thread-safe: one launch at a time per process (it owns SIGINT/SIGTERM while it runs).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl::client {

struct LocalLaunchOptions {
  std::string trainer;            // path of sftctl-trainer
  std::vector<std::string> args;  // argv[1..] of every rank, e.g. {"train", "--spec", "<run>/spec.json"}
  std::vector<std::string> rank0_args;  // appended for rank 0 only
  int ranks = 2;                        // >= 2
  std::string log_dir;                  // created if missing
  std::chrono::milliseconds kill_grace{10000};
};

struct LocalLaunchResult {
  // What sftctl should exit with: 0 when every rank exited 0; else the first failed rank's exit code,
  // or 128 + its signal number (never 0).
  int exit_code = 0;
  int first_failed_rank = -1;  // -1 when no rank failed
  std::string failure;         // "rank 1 failed first: killed by signal 9 (SIGKILL)"; empty when none
};

// Runs the ranks to completion (see the contract above). Errors: INVALID_ARGUMENT (ranks < 2),
// INTERNAL / errno errors naming the path when a rank or its log file cannot be set up (ranks already
// started are killed and reaped first).
StatusOr<LocalLaunchResult> LaunchLocalRanks(const LocalLaunchOptions& opts);

// The number of GPUs `nvidia-smi -L` lists ("GPU 0: ..." lines), 0 when it is absent or fails. For
// `--ranks auto` (the client never links CUDA).
int CountNvidiaGpus();

// A TCP port free on 127.0.0.1 right now (for MASTER_PORT); 29500 if none could be probed.
int FreeLoopbackPort();

}  // namespace sftctl::client
