#include "agent/slurm/slurm_job.h"

#include <fstream>

#include "common/os/file_system.h"

namespace sftctl::agent::slurm {
namespace {

std::string JobIdPath(const std::string& job_dir) { return job_dir + "/slurm/job_id"; }

// slurm/ and logs/ of the job folder, 0700 (an existing one of this user is made so).
Status MakeDirs(const std::string& job_dir) {
  for (const char* sub : {"/slurm", "/logs"}) SFT_RETURN_IF_ERROR(MakePrivateDir(job_dir + sub, false));
  return Status();
}

}  // namespace

StatusOr<std::string> SubmitJobFolder(const SlurmCli& cli, const SlurmOptions& options,
                                      const SbatchJob& job) {
  SFT_ASSIGN_OR_RETURN(std::string script, RenderSbatchScript(options, job));
  SFT_RETURN_IF_ERROR(MakeDirs(job.job_dir));
  SFT_RETURN_IF_ERROR(WritePrivateFile(RankEnvPath(job.job_dir), RenderRankEnv(job.rank_env)));
  SFT_RETURN_IF_ERROR(WritePrivateFile(ScriptPath(job.job_dir), script));
  SFT_RETURN_IF_ERROR(cli.CheckReady(options));
  SFT_RETURN_IF_ERROR(cli.TestSubmit(ScriptPath(job.job_dir)));
  SFT_ASSIGN_OR_RETURN(std::string id, cli.Submit(ScriptPath(job.job_dir)));
  if (Status st = WritePrivateFile(JobIdPath(job.job_dir), id + "\n"); !st.ok())
    return InternalError("Slurm job " + id +
                         " was queued, but its id could not be recorded: " + st.message());
  return id;
}

StatusOr<std::string> RecordedJobId(const std::string& job_dir) {
  std::ifstream in(JobIdPath(job_dir));
  if (!in) return NotFoundError("no Slurm job id recorded in " + JobIdPath(job_dir));
  std::string id, extra;
  in >> id >> extra;
  if (id.empty() || id.size() > 12 || id.find_first_not_of("0123456789") != std::string::npos ||
      !extra.empty())
    return DataLossError(JobIdPath(job_dir) + " does not hold a Slurm job id");
  return id;
}

}  // namespace sftctl::agent::slurm
