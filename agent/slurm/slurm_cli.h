// SlurmCli: the agent's Slurm commands (sbatch, squeue, sacct, scontrol, scancel) through the
// CommandRunner seam (agent/process/command_runner.h), so unit tests inject recorded outputs and the real
// runner runs them as the agent's user on the login node.
//
// Every command gets explicit output fields (slurm_state.h) and runs in the environment the runner
// gives its children (the allowlist of common/os/process_util.h: PATH, HOME, USER, ..., so a user's
// SQUEUE_FORMAT or SBATCH_* defaults never change what is parsed) plus `env` (e.g.
// "SLURM_CONF=/etc/slurm/slurm.conf"), put in front of the command.
//
// State (Query): squeue while Slurm's controller lists the job and it is not finished; then sacct;
// without accounting storage (no slurmdbd: "accounting storage is disabled") `scontrol show job`
// (kept for MinJobAge after the end) and last the job folder's slurm/runs record (sbatch_script.h),
// each fallback saying so in SlurmJobInfo::note.
//
// Thread safety: const methods only; safe from any thread, but each call blocks on a command (never
// call it on the supervisor's event thread or inside a gRPC reaction). `runner` must outlive it.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "agent/process/command_runner.h"
#include "agent/slurm/slurm_options.h"
#include "agent/slurm/slurm_state.h"
#include "common/status.h"

namespace sftctl::agent::slurm {

class SlurmCli {
 public:
  SlurmCli(CommandRunner* runner, std::vector<std::string> env,
           std::chrono::seconds timeout = std::chrono::seconds(30));

  // The environment entries the agent passes from its own: SLURM_CONF when set.
  static std::vector<std::string> EnvFromProcess();

  // Before anything is queued: sbatch, squeue, scontrol, scancel and sinfo are on PATH
  // (FAILED_PRECONDITION "this login node has no sbatch ..."), the controller answers (UNAVAILABLE
  // quoting `scontrol ping`), and each partition given exists (INVALID_ARGUMENT "slurm: field
  // 'partition': unknown partition 'x'; this cluster has: a, b").
  Status CheckReady(const SlurmOptions& options) const;

  // `sbatch --test-only SCRIPT`: Slurm checks the request (account, QOS, constraint, node count)
  // without queuing it. Errors: INVALID_ARGUMENT quoting sbatch's error.
  Status TestSubmit(const std::string& script_path) const;

  // `sbatch --parsable SCRIPT`: the new job's id. Errors: INVALID_ARGUMENT quoting sbatch's error
  // when it refused the job; INTERNAL when it printed no id; UNAVAILABLE when it timed out.
  StatusOr<std::string> Submit(const std::string& script_path) const;

  // The job's state (see the top of this file). `job_dir` "" skips the job folder. Errors: NOT_FOUND
  // when no source knows the job; UNAVAILABLE when squeue itself cannot reach the controller.
  StatusOr<SlurmJobInfo> Query(const std::string& job_id, const std::string& job_dir) const;

  // `scancel ID`. OK also when the job already ended. Errors: INTERNAL quoting scancel.
  Status Cancel(const std::string& job_id) const;

  // Whether a compute node sees `path` (on the shared filesystem) holding `expected`: `srun --nodes=1
  // --ntasks=1 --time=1 --immediate=3 cat PATH` in the options' partition, account and QOS. Errors:
  // FAILED_PRECONDITION quoting srun when the node cannot read it or reads something else;
  // RESOURCE_EXHAUSTED when no node was free within 3 s (nothing was checked; a busy cluster).
  Status CheckVisible(const SlurmOptions& options, const std::string& path,
                      const std::string& expected) const;

 private:
  // `env ... ARGS` with every argument quoted; the outcome, or the runner's error.
  StatusOr<CommandOutcome> Run(const std::vector<std::string>& args) const;
  StatusOr<SlurmJobInfo> QueryFinished(const std::string& job_id, const std::string& job_dir,
                                       std::optional<SlurmJobInfo> from_squeue) const;

  CommandRunner* runner_;
  std::vector<std::string> env_;
  std::chrono::seconds timeout_;
};

}  // namespace sftctl::agent::slurm
