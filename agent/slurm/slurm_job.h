// One job folder handed to Slurm: the part of a Slurm job the agent runs off its event thread.
//
// SubmitJobFolder creates slurm/ and logs/ (0700), writes <job_dir>/slurm/rank.env and
// slurm/job.sbatch (sbatch_script.h; 0600 through WritePrivateFile of common/os/file_system.h, never
// through a planted link), checks before anything is queued (SlurmCli::CheckReady, then `sbatch
// --test-only`), submits, and records the Slurm job id in <job_dir>/slurm/job_id (the same way), so
// an agent that restarts finds its jobs again (RecordedJobId). PhaseOf maps a Slurm state onto the agent's
// job phases, in one place.
//
// Thread safety: the functions are thread-safe for different job folders; they block on Slurm's
// commands (never call them on the supervisor's event thread).
#pragma once

#include <string>

#include "agent/slurm/sbatch_script.h"
#include "agent/slurm/slurm_cli.h"
#include "agent/slurm/slurm_options.h"
#include "agent/slurm/slurm_state.h"
#include "common/status.h"

namespace sftctl::agent::slurm {

// The Slurm job id, after it was recorded. Errors: those of RenderSbatchScript, CheckReady,
// TestSubmit and Submit (nothing is queued when one of the first three fails); MakePrivateDir's and
// WritePrivateFile's naming the folder or file when slurm/, logs/, rank.env or the script cannot be
// made; INTERNAL when the id cannot be written (the job was queued: the message names its id).
StatusOr<std::string> SubmitJobFolder(const SlurmCli& cli, const SlurmOptions& options, const SbatchJob& job);

// The id SubmitJobFolder recorded in `job_dir`. Errors: NOT_FOUND when there is none;
// DATA_LOSS when the file does not hold a job id.
StatusOr<std::string> RecordedJobId(const std::string& job_dir);

}  // namespace sftctl::agent::slurm
