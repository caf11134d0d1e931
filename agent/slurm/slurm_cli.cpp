#include "agent/slurm/slurm_cli.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "agent/slurm/sbatch_script.h"

namespace sftctl::agent::slurm {
namespace {

std::string FirstLine(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  return line.size() > 300 ? line.substr(0, 300) + "..." : line;
}

// The output without trailing newlines, at most 500 bytes, for messages.
std::string Quoted(const std::string& text) {
  std::string t = text.substr(0, 500);
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  return "'" + t + "'";
}

bool Contains(const std::string& text, const char* what) { return text.find(what) != std::string::npos; }

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string DescribeOutcome(const CommandOutcome& o) {
  if (o.timed_out) return "timed out after " + std::to_string(o.timeout_s) + " s";
  if (o.signal != 0) return "killed by signal " + std::to_string(o.signal);
  return "exit code " + std::to_string(o.exit_code);
}

// The partition names of `scontrol -o show partition [NAME]` ("PartitionName=debug ..." per line).
std::vector<std::string> PartitionNames(const std::string& output) {
  std::vector<std::string> names;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("PartitionName=", 0) == 0) names.push_back(line.substr(14, line.find(' ') - 14));
  }
  return names;
}

}  // namespace

SlurmCli::SlurmCli(CommandRunner* runner, std::vector<std::string> env, std::chrono::seconds timeout)
    : runner_(runner), env_(std::move(env)), timeout_(timeout) {}

std::vector<std::string> SlurmCli::EnvFromProcess() {
  std::vector<std::string> env;
  if (const char* conf = std::getenv("SLURM_CONF"); conf != nullptr && *conf != '\0')
    env.push_back(std::string("SLURM_CONF=") + conf);
  return env;
}

StatusOr<CommandOutcome> SlurmCli::Run(const std::vector<std::string>& args) const {
  std::string cmd = env_.empty() ? "" : "env";
  for (const std::string& e : env_) cmd += " " + ShellQuote(e);
  for (const std::string& a : args) cmd += (cmd.empty() ? "" : " ") + ShellQuote(a);
  SFT_ASSIGN_OR_RETURN(CommandOutcome out, runner_->Run(cmd, timeout_));
  if (out.timed_out) return UnavailableError(args[0] + " " + DescribeOutcome(out));
  return out;
}

Status SlurmCli::CheckReady(const SlurmOptions& options) const {
  for (const char* tool : {"sbatch", "squeue", "scontrol", "scancel", "sinfo"}) {
    // (`sbatch --version` needs a configuration already; `command -v` only the PATH.)
    SFT_ASSIGN_OR_RETURN(CommandOutcome out, Run({"sh", "-c", std::string("command -v ") + tool}));
    if (!out.ok())
      return FailedPreconditionError(
          std::string("this login node has no ") + tool +
          ": Slurm's client commands are not on the agent's PATH (install slurm-client, "
          "or start sftd where `" +
          tool + "` runs)");
  }
  SFT_ASSIGN_OR_RETURN(CommandOutcome ping, Run({"scontrol", "ping"}));
  if (!ping.ok() || !Contains(ping.output, "UP"))
    return UnavailableError("the Slurm controller does not answer (scontrol ping: " + DescribeOutcome(ping) +
                            "): " + Quoted(ping.output));
  std::istringstream wanted(options.partition);
  for (std::string p; std::getline(wanted, p, ',');) {
    // One partition at a time: a cluster's whole list can outgrow the runner's output limit.
    SFT_ASSIGN_OR_RETURN(CommandOutcome part, Run({"scontrol", "-o", "show", "partition", p}));
    const std::vector<std::string> names =
        part.ok() ? PartitionNames(part.output) : std::vector<std::string>();
    if (std::find(names.begin(), names.end(), p) != names.end()) continue;
    SFT_ASSIGN_OR_RETURN(CommandOutcome all, Run({"sinfo", "-h", "-o", "%R"}));
    std::set<std::string> known;
    std::istringstream in(all.output);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) known.insert(line);
    std::string list;
    for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
    return FieldError("slurm", "partition", "unknown partition '" + p + "'; this cluster has: " + list);
  }
  return Status();
}

Status SlurmCli::TestSubmit(const std::string& script_path) const {
  SFT_ASSIGN_OR_RETURN(CommandOutcome out, Run({"sbatch", "--test-only", script_path}));
  if (!out.ok())
    return InvalidArgumentError("Slurm refuses the job (sbatch --test-only): " + Quoted(out.output));
  return Status();
}

StatusOr<std::string> SlurmCli::Submit(const std::string& script_path) const {
  SFT_ASSIGN_OR_RETURN(CommandOutcome out, Run({"sbatch", "--parsable", script_path}));
  if (!out.ok())
    return InvalidArgumentError("sbatch refused the job (" + DescribeOutcome(out) +
                                "): " + Quoted(out.output));
  return ParseSbatchParsable(out.output);
}

StatusOr<SlurmJobInfo> SlurmCli::Query(const std::string& job_id, const std::string& job_dir) const {
  SFT_ASSIGN_OR_RETURN(CommandOutcome sq,
                       Run({"squeue", "-h", "-t", "all", "-j", job_id, "-o", kSqueueFormat}));
  std::optional<SlurmJobInfo> info = ParseSqueue(sq.output, job_id);
  if (!info.has_value() && !sq.ok() && !Contains(sq.output, "Invalid job id"))
    return UnavailableError("squeue failed (" + DescribeOutcome(sq) + "): " + Quoted(sq.output));
  if (info.has_value() && !IsTerminal(info->state)) return *info;
  SFT_ASSIGN_OR_RETURN(SlurmJobInfo done, QueryFinished(job_id, job_dir, std::move(info)));
  if (done.state == SlurmState::kFailed && !job_dir.empty()) {
    std::vector<TaskFailure> failures = ParseTaskFailures(ReadWholeFile(BatchOutputPath(job_dir)));
    if (!failures.empty()) done.first_failure = failures.front();
  }
  return done;
}

StatusOr<SlurmJobInfo> SlurmCli::QueryFinished(const std::string& job_id, const std::string& job_dir,
                                               std::optional<SlurmJobInfo> from_squeue) const {
  SFT_ASSIGN_OR_RETURN(CommandOutcome acct,
                       Run({"sacct", "-n", "-P", "-X", "-j", job_id, "-o", kSacctFields}));
  if (acct.ok()) {
    if (std::optional<SlurmJobInfo> info = ParseSacct(acct.output, job_id)) return *info;
  }
  const std::string why =
      Contains(acct.output, "accounting storage is disabled")
          ? "no accounting storage (sacct: Slurm accounting storage is disabled)"
          : "sacct has no record (" + DescribeOutcome(acct) + ": " + FirstLine(acct.output) + ")";
  SFT_ASSIGN_OR_RETURN(CommandOutcome sc, Run({"scontrol", "-o", "show", "job", job_id}));
  if (std::optional<SlurmJobInfo> info = ParseScontrolJob(sc.output, job_id)) {
    info->note = why + "; state from scontrol show job";
    return *info;
  }
  if (from_squeue.has_value()) {
    from_squeue->note = why + "; state from squeue, without an exit code";
    return *from_squeue;
  }
  if (!job_dir.empty()) {
    if (std::optional<ExitRecord> rec = LastExitRecord(ReadWholeFile(RunsFilePath(job_dir)), job_id)) {
      SlurmJobInfo info;
      info.job_id = job_id;
      info.state_name = rec->exit_code == 0 ? "COMPLETED" : "FAILED";
      info.state = ParseSlurmState(info.state_name);
      info.exit_code = rec->exit_code;
      info.restarts = rec->restart;
      info.source = "job folder";
      info.note = why + "; Slurm no longer lists the job: state from the job folder's slurm/runs";
      return info;
    }
  }
  return NotFoundError("Slurm knows no job " + job_id + " (squeue, scontrol) and " + why);
}

Status SlurmCli::Cancel(const std::string& job_id) const {
  SFT_ASSIGN_OR_RETURN(CommandOutcome out, Run({"scancel", job_id}));
  if (out.ok() || Contains(out.output, "already completing or completed") ||
      Contains(out.output, "Invalid job id"))
    return Status();
  return InternalError("scancel " + job_id + " failed (" + DescribeOutcome(out) + "): " + Quoted(out.output));
}

Status SlurmCli::CheckVisible(const SlurmOptions& options, const std::string& path,
                              const std::string& expected) const {
  std::vector<std::string> args = {"srun", "--nodes=1", "--ntasks=1", "--time=1", "--immediate=3"};
  if (!options.partition.empty()) args.push_back("--partition=" + options.partition);
  if (!options.account.empty()) args.push_back("--account=" + options.account);
  if (!options.qos.empty()) args.push_back("--qos=" + options.qos);
  args.insert(args.end(), {"--job-name=sftctl-probe", "cat", path});
  SFT_ASSIGN_OR_RETURN(CommandOutcome out, Run(args));
  if (out.ok() && Contains(out.output, expected.c_str())) return Status();
  if (Contains(out.output, "Unable to allocate resources") || Contains(out.output, "Immediate"))
    return ResourceExhaustedError("no node was free for the probe within 3 s: " + Quoted(out.output));
  return FailedPreconditionError("a compute node cannot read " + path + " (srun " + DescribeOutcome(out) +
                                 "): " + Quoted(out.output));
}

}  // namespace sftctl::agent::slurm
