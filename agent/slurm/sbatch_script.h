// The sbatch script of one job: the #SBATCH header from SlurmOptions and a body that starts one
// trainer rank per GPU (per CPU slot on CPU nodes) with `srun --kill-on-bad-exit=1`.
//
// The environment, the rank allowlist of common/os/process_util.h as for a local rank: `--export=NONE`,
// so nothing of sbatch's environment or the agent's reaches the job but SLURM_* (Slurm 22.05 then
// starts the batch script in the user's login environment, --get-user-env). The script unsets every
// exported variable but Slurm's own (SLURM_*, SLURMD_NODENAME, a GRES's GPU binding) and those the
// rank allowlist passes, sources slurm/rank.env (RenderRankEnv: the agent's allowlisted environment,
// which wins over the node's), and `srun --export=ALL` hands that on; each rank narrows its
// environment the same way again (a TaskProlog may add to it) before torch.distributed's variables.
//
// The body, run by Slurm on the job's first node, with umask 077 (what the job writes stays private):
//   * MASTER_ADDR: the first host of `scontrol show hostnames $SLURM_JOB_NODELIST`, as its NodeAddr
//     when `scontrol show node` gives one (a node name need not resolve); MASTER_PORT: a random port
//     of kPortBase + [0, kPortSpan) that no TCP socket of the first node uses (/proc/net/tcp{,6},
//     read when the script runs there, as it does), so jobs of other users or clusters that meet on a
//     node do not take one port; else kPortBase + (job id + 7919 x restart count) mod kPortSpan. A
//     port taken between the pick and rank 0's bind fails rank 0 with "cannot join ... is MASTER_PORT
//     free on rank 0's host?" (trainer/distributed/distributed.cpp) and the job with it (--kill-on-bad-exit).
//   * Each rank: RANK, WORLD_SIZE, LOCAL_RANK from SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and
//     LOCAL_WORLD_SIZE = ranks per node; runs `<trainer> train --spec <job_dir>/spec.json
//     --events-fd 3` in the job folder with stdout, stderr and fd 3 appended to logs/rank-R.{stdout,
//     stderr,events} (agent/process/launcher.h's RankFile names, so the agent tails them as for any job).
//   * slurm/batch.out (appended) gets the batch script's and srun's own output; one line per run is
//     appended to slurm/runs (ExitRecord below): the Slurm job id, the restart count and srun's exit
//     code, the job folder's own record of how each run ended when Slurm keeps none.
//
// Thread safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/slurm/slurm_options.h"
#include "common/status.h"

namespace sftctl::agent::slurm {

inline constexpr int kPortBase = 20000;
inline constexpr int kPortSpan = 10000;

struct SbatchJob {
  std::string job_name;  // e.g. "sftctl-job-3": [A-Za-z0-9_.-]
  std::string job_dir;   // absolute, on the shared filesystem (visible from every compute node)
  std::string trainer;   // absolute path of sftctl-trainer, as the compute nodes see it
  // NAME=value entries for slurm/rank.env (RenderRankEnv), e.g. ChildEnvironment(ChildKind::kRank).
  std::vector<std::string> rank_env;
};

// The script's text. Errors: INVALID_ARGUMENT when the options fail ValidateSlurmOptions, or a path
// is not absolute or holds a character outside [A-Za-z0-9_./+@:,=-] (so that #SBATCH lines need no
// quoting and no '%' turns into a Slurm filename pattern), or the job name is not a Slurm name.
StatusOr<std::string> RenderSbatchScript(const SlurmOptions& options, const SbatchJob& job);

// `s` in single quotes for /bin/sh ("it's" -> 'it'\''s').
std::string ShellQuote(const std::string& s);

// Where the script keeps its own files in the job folder.
std::string BatchOutputPath(const std::string& job_dir);  // <job_dir>/slurm/batch.out
std::string RunsFilePath(const std::string& job_dir);     // <job_dir>/slurm/runs
std::string ScriptPath(const std::string& job_dir);       // <job_dir>/slurm/job.sbatch
std::string RankEnvPath(const std::string& job_dir);      // <job_dir>/slurm/rank.env

// The text of slurm/rank.env: `export NAME='value'` per entry of `env` (NAME=value strings, in their
// order), except names that are not shell identifiers and the variables the script or Slurm sets for
// each rank (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// CUDA_VISIBLE_DEVICES: a login node's GPUs are not the job's).
std::string RenderRankEnv(const std::vector<std::string>& env);

// One line of slurm/runs: "job=<id> restart=<n> rc=<srun's exit code>".
struct ExitRecord {
  std::string job_id;
  int restart = 0;
  int exit_code = 0;
};
// The last well-formed record of `runs_text` for `job_id`; nullopt when there is none (the job has
// not finished a run, or the file is from another job). Malformed lines are skipped.
std::optional<ExitRecord> LastExitRecord(const std::string& runs_text, const std::string& job_id);

}  // namespace sftctl::agent::slurm
