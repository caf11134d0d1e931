#include "agent/slurm/slurm_job.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace sftctl::agent::slurm {
namespace {

std::string JobIdPath(const std::string& job_dir) { return job_dir + "/slurm/job_id"; }

// Writes `text` to `path` through a temporary file and a rename.
Status WriteFileReplacing(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) return InternalError("cannot write " + tmp + ": " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return InternalError("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  return Status();
}

Status MakeDirs(const std::string& job_dir) {
  std::error_code ec;
  for (const char* sub : {"/slurm", "/logs"}) {
    std::filesystem::create_directories(job_dir + sub, ec);
    if (ec) return InternalError("cannot create " + job_dir + sub + ": " + ec.message());
  }
  return Status();
}

}  // namespace

StatusOr<std::string> SubmitJobFolder(const SlurmCli& cli, const SlurmOptions& options,
                                      const SbatchJob& job) {
  SFT_ASSIGN_OR_RETURN(std::string script, RenderSbatchScript(options, job));
  SFT_RETURN_IF_ERROR(MakeDirs(job.job_dir));
  SFT_RETURN_IF_ERROR(WriteFileReplacing(ScriptPath(job.job_dir), script));
  SFT_RETURN_IF_ERROR(cli.CheckReady(options));
  SFT_RETURN_IF_ERROR(cli.TestSubmit(ScriptPath(job.job_dir)));
  SFT_ASSIGN_OR_RETURN(std::string id, cli.Submit(ScriptPath(job.job_dir)));
  if (Status st = WriteFileReplacing(JobIdPath(job.job_dir), id + "\n"); !st.ok())
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
