#include "agent/slurm/sbatch_script.h"

#include <cctype>
#include <set>
#include <sstream>

#include "common/os/process_util.h"

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
    << "#SBATCH --open-mode=append\n"
    << "#SBATCH --export=NONE\n";
  for (const std::string& arg : o.extra_args) s << "#SBATCH " << arg << "\n";
}

// A bash loop that unsets every exported variable but Slurm's own (SLURM_*, the node's name, the GPU
// binding of a GRES), those the rank allowlist passes (common/os/process_util.h) and `extra` ("A|B").
std::string KeepOnlyRankEnvironment(const std::string& extra) {
  std::string keep = "SLURM_*|SLURMD_NODENAME|GPU_DEVICE_ORDINAL|ROCR_VISIBLE_DEVICES|ZE_AFFINITY_MASK";
  for (const std::string& p : ChildEnvPatterns(ChildKind::kRank)) keep += "|" + p;
  if (!extra.empty()) keep += "|" + extra;
  return "for v in $(compgen -e); do case $v in " + keep + ") ;; *) unset \"$v\" 2>/dev/null ;; esac; done";
}

// The rank command srun runs: the environment narrowed again (whatever the node added: a login
// environment, a TaskProlog's), the torch.distributed variables from Slurm's, then the trainer with
// its three log files (names as agent/process/launcher.h's RankFile).
std::string RankCommand(const SlurmOptions& o) {
  return KeepOnlyRankEnvironment("MASTER_ADDR|MASTER_PORT") +
         "; export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID LOCAL_WORLD_SIZE=" +
         std::to_string(o.ranks_per_node()) +
         "; exec \"$0\" train --spec spec.json --events-fd 3 >>\"logs/rank-$RANK.stdout\" "
         "2>>\"logs/rank-$RANK.stderr\" 3>>\"logs/rank-$RANK.events\"";
}

// MASTER_PORT: on the first node (where the batch script runs), a random port of kPortBase +
// [0, kPortSpan) that no local TCP socket uses (/proc/net/tcp, tcp6); elsewhere, or when 100 draws
// found none, kPortBase + (job id + 7919 x restart count) mod kPortSpan.
std::string MasterPortLines() {
  const std::string base = std::to_string(kPortBase), span = std::to_string(kPortSpan);
  return "MASTER_PORT=\n"
         "if [ \"${SLURMD_NODENAME:-}\" = \"$first\" ] && [ -r /proc/net/tcp ]; then\n"
         "  used=\" $(awk 'FNR > 1 { split($2, a, \":\"); print a[2] }' /proc/net/tcp /proc/net/tcp6 "
         "2>/dev/null |\n"
         "    while read -r h; do case $h in [0-9A-Fa-f]*) echo $((16#$h)) ;; esac; done | tr '\\n' ' ')\"\n"
         "  for _ in $(seq 100); do\n"
         "    p=$((" +
         base + " + RANDOM % " + span +
         "))\n"
         "    case $used in *\" $p \"*) ;; *) MASTER_PORT=$p; break ;; esac\n"
         "  done\n"
         "fi\n"
         "export MASTER_PORT=${MASTER_PORT:-$((" +
         base + " + (SLURM_JOB_ID + 7919 * restart) % " + span + "))}\n";
}

void RenderBody(const SlurmOptions& o, const SbatchJob& job, std::ostringstream& s) {
  s << "set -u\n"
    << "umask 077\n"
    << "cd " << ShellQuote(job.job_dir) << " || exit 1\n"
    << KeepOnlyRankEnvironment("") << "\n"
    << ". ./slurm/rank.env || exit 1\n"
    << "export PATH=\"${PATH:-/usr/local/bin:/usr/bin:/bin}\"\n"
    << "mkdir -p logs slurm\n"
    << "restart=${SLURM_RESTART_COUNT:-0}\n"
    << "first=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n"
    << "addr=$(scontrol show node \"$first\" 2>/dev/null | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p' | head -n "
       "1)\n"
    << "export MASTER_ADDR=${addr:-$first}\n"
    << MasterPortLines()
    << "echo \"sftctl: job $SLURM_JOB_ID run $restart on $SLURM_JOB_NODELIST, master "
       "$MASTER_ADDR:$MASTER_PORT\"\n"
    << "srun --export=ALL --kill-on-bad-exit=1 --nodes=" << o.nodes
    << " --ntasks-per-node=" << o.ranks_per_node() << " bash -c " << ShellQuote(RankCommand(o)) << " "
    << ShellQuote(job.trainer) << "\n"
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
std::string RankEnvPath(const std::string& job_dir) { return job_dir + "/slurm/rank.env"; }

std::string RenderRankEnv(const std::vector<std::string>& env) {
  static const std::set<std::string, std::less<>> kSetByTheScript = {
      "RANK",        "WORLD_SIZE",  "LOCAL_RANK",          "LOCAL_WORLD_SIZE",
      "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"};
  std::string out =
      "# The ranks' environment: the agent's, as the rank allowlist passes it "
      "(common/os/process_util.h); written by sftd.\n";
  for (const std::string& e : env) {
    const size_t eq = e.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    const std::string name = e.substr(0, eq);
    const bool identifier =
        std::isdigit(static_cast<unsigned char>(name[0])) == 0 &&
        name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") ==
            std::string::npos;
    if (!identifier || kSetByTheScript.count(name) != 0) continue;
    out += "export " + name + "=" + ShellQuote(e.substr(eq + 1)) + "\n";
  }
  return out;
}

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
