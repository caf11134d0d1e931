#include "agent/slurm/slurm_state.h"

#include <map>
#include <sstream>
#include <string_view>

namespace sftctl::agent::slurm {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    out.push_back(line);
  }
  return out;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t pos; (pos = s.find(sep, start)) != std::string::npos; start = pos + 1)
    out.push_back(s.substr(start, pos - start));
  out.push_back(s.substr(start));
  return out;
}

bool AllDigits(std::string_view s) {
  return !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string_view::npos;
}

// The state's first word ("CANCELLED by 0" -> "CANCELLED"); `info` gets it and its enum.
void SetState(const std::string& text, SlurmJobInfo* info) {
  info->state_name = text.substr(0, text.find(' '));
  info->state = ParseSlurmState(info->state_name);
}

std::string CleanReason(const std::string& r) { return r == "None" || r == "(null)" ? "" : r; }
std::string CleanNodes(const std::string& n) { return n == "None assigned" || n == "(null)" ? "" : n; }

}  // namespace

SlurmState ParseSlurmState(const std::string& name) {
  static const std::map<std::string, SlurmState, std::less<>> kNames = {
      {"PENDING", SlurmState::kPending},
      {"PD", SlurmState::kPending},
      {"CONFIGURING", SlurmState::kConfiguring},
      {"CF", SlurmState::kConfiguring},
      {"RUNNING", SlurmState::kRunning},
      {"R", SlurmState::kRunning},
      {"COMPLETING", SlurmState::kCompleting},
      {"CG", SlurmState::kCompleting},
      {"SUSPENDED", SlurmState::kSuspended},
      {"S", SlurmState::kSuspended},
      {"REQUEUED", SlurmState::kRequeued},
      {"RQ", SlurmState::kRequeued},
      {"REQUEUE_HOLD", SlurmState::kRequeued},
      {"RH", SlurmState::kRequeued},
      {"REQUEUE_FED", SlurmState::kRequeued},
      {"RF", SlurmState::kRequeued},
      {"COMPLETED", SlurmState::kCompleted},
      {"CD", SlurmState::kCompleted},
      {"FAILED", SlurmState::kFailed},
      {"F", SlurmState::kFailed},
      {"CANCELLED", SlurmState::kCancelled},
      {"CA", SlurmState::kCancelled},
      {"TIMEOUT", SlurmState::kTimeout},
      {"TO", SlurmState::kTimeout},
      {"NODE_FAIL", SlurmState::kNodeFail},
      {"NF", SlurmState::kNodeFail},
      {"PREEMPTED", SlurmState::kPreempted},
      {"PR", SlurmState::kPreempted},
      {"BOOT_FAIL", SlurmState::kBootFail},
      {"BF", SlurmState::kBootFail},
      {"DEADLINE", SlurmState::kDeadline},
      {"DL", SlurmState::kDeadline},
      {"OUT_OF_MEMORY", SlurmState::kOutOfMemory},
      {"OOM", SlurmState::kOutOfMemory},
  };
  auto it = kNames.find(std::string_view(name).substr(0, name.find(' ')));
  return it == kNames.end() ? SlurmState::kOther : it->second;
}

SlurmPhase PhaseOf(SlurmState state) {
  switch (state) {
    case SlurmState::kRunning:
    case SlurmState::kCompleting:
      return SlurmPhase::kRunning;
    case SlurmState::kCompleted:
      return SlurmPhase::kSucceeded;
    case SlurmState::kCancelled:
      return SlurmPhase::kCancelled;
    case SlurmState::kFailed:
    case SlurmState::kTimeout:
    case SlurmState::kNodeFail:
    case SlurmState::kPreempted:
    case SlurmState::kBootFail:
    case SlurmState::kDeadline:
    case SlurmState::kOutOfMemory:
      return SlurmPhase::kFailed;
    default:
      return SlurmPhase::kWaiting;
  }
}

bool IsTerminal(SlurmState s) {
  const SlurmPhase p = PhaseOf(s);
  return p == SlurmPhase::kSucceeded || p == SlurmPhase::kFailed || p == SlurmPhase::kCancelled;
}

std::string SlurmJobInfo::Describe() const {
  std::string out = state_name.empty() ? "UNKNOWN" : state_name;
  if (state == SlurmState::kRunning || state == SlurmState::kCompleting) {
    if (!nodes.empty()) out += " on " + nodes;
  } else if (state == SlurmState::kFailed || state == SlurmState::kOutOfMemory) {
    if (first_failure.has_value())
      out += " with exit code " + std::to_string(first_failure->exit_code) + " (rank " +
             std::to_string(first_failure->task) + " on " + first_failure->node + ")";
    else if (exit_signal != 0)
      out += " by signal " + std::to_string(exit_signal);
    else if (exit_code.has_value())
      out += " with exit code " + std::to_string(*exit_code);
  }
  // (A running or completed job has no reason worth showing; a failed one's is its exit code.)
  const bool says_more =
      state != SlurmState::kRunning && state != SlurmState::kCompleted && reason != "NonZeroExitCode";
  if (!reason.empty() && says_more) out += " (" + reason + ")";
  return out;
}

StatusOr<std::string> ParseSbatchParsable(const std::string& output) {
  for (const std::string& line : Lines(output)) {
    const std::string id = line.substr(0, line.find(';'));
    if (AllDigits(id)) return id;
  }
  return InternalError("sbatch --parsable printed no job id: '" + output.substr(0, 500) + "'");
}

std::optional<SlurmJobInfo> ParseSqueue(const std::string& output, const std::string& job_id) {
  for (const std::string& line : Lines(output)) {
    const std::vector<std::string> f = Split(line, '|');
    if (f.size() != 4 || f[0] != job_id) continue;
    SlurmJobInfo info;
    info.job_id = job_id;
    SetState(f[1], &info);
    info.reason = CleanReason(f[2]);
    info.nodes = CleanNodes(f[3]);
    info.source = "squeue";
    return info;
  }
  return std::nullopt;
}

std::optional<SlurmJobInfo> ParseSacct(const std::string& output, const std::string& job_id) {
  std::optional<SlurmJobInfo> last;
  for (const std::string& line : Lines(output)) {
    const std::vector<std::string> f = Split(line, '|');
    if (f.size() != 4 || f[0] != job_id) continue;
    SlurmJobInfo info;
    info.job_id = job_id;
    SetState(f[1], &info);
    if (auto ec = ParseExitCode(f[2])) {
      info.exit_code = ec->first;
      info.exit_signal = ec->second;
    }
    info.nodes = CleanNodes(f[3]);
    info.source = "sacct";
    last = info;
  }
  return last;
}

std::optional<SlurmJobInfo> ParseScontrolJob(const std::string& output, const std::string& job_id) {
  for (const std::string& line : Lines(output)) {
    if (line.rfind("JobId=" + job_id + " ", 0) != 0) continue;
    std::map<std::string, std::string> kv;
    std::istringstream in(line);
    for (std::string tok; in >> tok;) {
      const size_t eq = tok.find('=');
      if (eq != std::string::npos && eq > 0) kv.emplace(tok.substr(0, eq), tok.substr(eq + 1));
    }
    SlurmJobInfo info;
    info.job_id = job_id;
    SetState(kv["JobState"], &info);
    info.reason = CleanReason(kv["Reason"]);
    info.nodes = CleanNodes(kv["NodeList"]);
    if (auto ec = ParseExitCode(kv["ExitCode"])) {
      info.exit_code = ec->first;
      info.exit_signal = ec->second;
    }
    if (AllDigits(kv["Restarts"])) info.restarts = std::stoi(kv["Restarts"]);
    info.source = "scontrol";
    return info;
  }
  return std::nullopt;
}

std::optional<std::pair<int, int>> ParseExitCode(const std::string& text) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return std::nullopt;
  const std::string a = text.substr(0, colon), b = text.substr(colon + 1);
  if (!AllDigits(a) || !AllDigits(b) || a.size() > 3 || b.size() > 3) return std::nullopt;
  return std::make_pair(std::stoi(a), std::stoi(b));
}

std::vector<TaskFailure> ParseTaskFailures(const std::string& output) {
  static constexpr std::string_view kPrefix = "srun: error: ", kTask = ": task ",
                                    kExited = ": Exited with exit code ";
  std::vector<TaskFailure> out;
  for (const std::string& line : Lines(output)) {
    if (line.rfind(kPrefix, 0) != 0) continue;
    const size_t task = line.find(kTask, kPrefix.size());
    const size_t exited = task == std::string::npos ? task : line.find(kExited, task);
    if (exited == std::string::npos) continue;
    const std::string node = line.substr(kPrefix.size(), task - kPrefix.size());
    const std::string rank = line.substr(task + kTask.size(), exited - task - kTask.size());
    const std::string code = line.substr(exited + kExited.size());
    if (node.empty() || !AllDigits(rank) || !AllDigits(code) || code.size() > 3) continue;
    out.push_back(TaskFailure{node, std::stoi(rank), std::stoi(code)});
  }
  return out;
}

}  // namespace sftctl::agent::slurm
