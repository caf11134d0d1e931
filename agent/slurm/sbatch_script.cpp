#include "agent/slurm/sbatch_script.h"

#include <cctype>
#include <sstream>

namespace sftctl::agent::slurm {
namespace {

bool SafePathChars(const std::string& p) {
  for (char c : p) {
    if (std::isalnum(static_cast<unsigned char>(c)) == 0 &&
        std::string_view("_./+@:,=-").find(c) == std::string::npos)
      return false;
  }
  return true;
}

Status CheckPath(const std::string& path, const std::string& what) {
  if (path.empty() || path[0] != '/')
    return InvalidArgumentError(what + " '" + path + "' is not an absolute path");
  if (!SafePathChars(path))
    return InvalidArgumentError(what + " '" + path +
                                "' has a character Slurm scripts cannot take unquoted (allowed: letters, "
                                "digits and _./+@:,=-)");
  return Status();
}

void RenderHeader(const SlurmOptions& o, const SbatchJob& job, std::ostringstream& s) {
  s << "#!/bin/bash\n"
    << "# " << job.job_name << ": rendered by sftd (agent/slurm/sbatch_script.h); edits are overwritten.\n"
    << "#SBATCH --job-name=" << job.job_name << "\n"
    << "#SBATCH --nodes=" << o.nodes << "\n"
    << "#SBATCH --ntasks-per-node=" << o.ranks_per_node() << "\n";
  if (o.gpus_per_node > 0) s << "#SBATCH --gpus-per-node=" << o.gpus_per_node << "\n";
  if (!o.partition.empty()) s << "#SBATCH --partition=" << o.partition << "\n";
  if (!o.account.empty()) s << "#SBATCH --account=" << o.account << "\n";
  if (!o.qos.empty()) s << "#SBATCH --qos=" << o.qos << "\n";
  if (!o.time.empty()) s << "#SBATCH --time=" << o.time << "\n";
  if (!o.constraint.empty()) s << "#SBATCH --constraint=" << o.constraint << "\n";
  s << "#SBATCH " << (o.requeue ? "--requeue" : "--no-requeue") << "\n"
    << "#SBATCH --chdir=" << job.job_dir << "\n"
    << "#SBATCH --output=" << BatchOutputPath(job.job_dir) << "\n"
    << "#SBATCH --open-mode=append\n";
  for (const std::string& arg : o.extra_args) s << "#SBATCH " << arg << "\n";
}

// The rank command srun runs: the torch.distributed variables from Slurm's, then the trainer with its
// three log files (names as agent/launcher.h's RankFile).
std::string RankCommand(const SlurmOptions& o) {
  return "export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID LOCAL_WORLD_SIZE=" +
         std::to_string(o.ranks_per_node()) +
         "; exec \"$0\" train --spec spec.json --events-fd 3 >>\"logs/rank-$RANK.stdout\" "
         "2>>\"logs/rank-$RANK.stderr\" 3>>\"logs/rank-$RANK.events\"";
}

void RenderBody(const SlurmOptions& o, const SbatchJob& job, std::ostringstream& s) {
  s << "set -u\n"
    << "cd " << ShellQuote(job.job_dir) << " || exit 1\n"
    << "mkdir -p logs slurm\n"
    << "restart=${SLURM_RESTART_COUNT:-0}\n"
    << "first=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n"
    << "addr=$(scontrol show node \"$first\" 2>/dev/null | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p' | head -n "
       "1)\n"
    << "export MASTER_ADDR=${addr:-$first}\n"
    << "export MASTER_PORT=$((" << kPortBase << " + (SLURM_JOB_ID + 7919 * restart) % " << kPortSpan << "))\n"
    << "echo \"sftctl: job $SLURM_JOB_ID run $restart on $SLURM_JOB_NODELIST, master "
       "$MASTER_ADDR:$MASTER_PORT\"\n"
    << "srun --kill-on-bad-exit=1 --nodes=" << o.nodes << " --ntasks-per-node=" << o.ranks_per_node()
    << " bash -c " << ShellQuote(RankCommand(o)) << " " << ShellQuote(job.trainer) << "\n"
    << "rc=$?\n"
    << "echo \"job=$SLURM_JOB_ID restart=$restart rc=$rc\" >>slurm/runs\n"
    << "exit $rc\n";
}

}  // namespace

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

std::string BatchOutputPath(const std::string& job_dir) { return job_dir + "/slurm/batch.out"; }
std::string RunsFilePath(const std::string& job_dir) { return job_dir + "/slurm/runs"; }
std::string ScriptPath(const std::string& job_dir) { return job_dir + "/slurm/job.sbatch"; }

StatusOr<std::string> RenderSbatchScript(const SlurmOptions& options, const SbatchJob& job) {
  SFT_RETURN_IF_ERROR(ValidateSlurmOptions(options));
  SFT_RETURN_IF_ERROR(CheckPath(job.job_dir, "job folder"));
  SFT_RETURN_IF_ERROR(CheckPath(job.trainer, "trainer"));
  if (job.job_name.empty() || job.job_name.size() > 128 ||
      job.job_name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") !=
          std::string::npos)
    return InvalidArgumentError("job name '" + job.job_name +
                                "' is not a Slurm name (letters, digits and _.-)");
  std::ostringstream s;
  RenderHeader(options, job, s);
  RenderBody(options, job, s);
  return s.str();
}

std::optional<ExitRecord> LastExitRecord(const std::string& runs_text, const std::string& job_id) {
  std::optional<ExitRecord> last;
  std::istringstream in(runs_text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string job, restart, rc, extra;
    if (!(f >> job >> restart >> rc) || (f >> extra)) continue;
    if (job != "job=" + job_id || restart.rfind("restart=", 0) != 0 || rc.rfind("rc=", 0) != 0) continue;
    const std::string r = restart.substr(8), c = rc.substr(3);
    if (r.empty() || c.empty() || r.size() > 6 || c.size() > 3 ||
        r.find_first_not_of("0123456789") != std::string::npos ||
        c.find_first_not_of("0123456789") != std::string::npos)
      continue;
    last = ExitRecord{job_id, std::stoi(r), std::stoi(c)};
  }
  return last;
}

}  // namespace sftctl::agent::slurm
