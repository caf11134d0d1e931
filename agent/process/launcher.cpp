#include "agent/process/launcher.h"

#include <dirent.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace sftctl::agent {

std::string RankFile(const std::string& job_dir, int rank, int src) {
  static const char* kExt[] = {"stdout", "stderr", "events"};
  return job_dir + "/logs/rank-" + std::to_string(rank) + "." + kExt[src];
}

StatusOr<std::vector<SpawnedRank>> StartJobRanks(const std::string& trainer, const std::string& job_dir,
                                                 const std::vector<RankEnv>& envs) {
  std::vector<RankCommand> cmds;
  Status st;
  for (size_t i = 0; st.ok() && i < envs.size(); ++i) {
    RankCommand cmd;
    cmd.argv = {trainer, "train", "--spec", job_dir + "/spec.json", "--events-fd", "3"};
    cmd.env = RankEnvironment(envs[i]);
    cmd.cwd = job_dir;
    st = OpenRankLogs(RankFile(job_dir, envs[i].rank, 0), RankFile(job_dir, envs[i].rank, 1),
                      RankFile(job_dir, envs[i].rank, 2), &cmd);
    if (st.ok()) cmds.push_back(std::move(cmd));
  }
  StatusOr<std::vector<pid_t>> pids = st.ok() ? StartRankGroup(cmds) : st;
  for (RankCommand& cmd : cmds) CloseRankLogs(&cmd);
  if (!pids.ok()) return pids.status();
  std::vector<SpawnedRank> out;
  for (size_t i = 0; i < pids->size(); ++i) {
    SpawnedRank r;
    r.rank = envs[i].rank;
    r.pid = (*pids)[i];
    if (auto stat = ReadProcStat(r.pid)) r.start_time = stat->start_time;
    out.push_back(r);
  }
  return out;
}

std::optional<ProcStat> ReadProcStat(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  if (!f) return std::nullopt;
  std::string line;
  std::getline(f, line);
  // The command name (field 2) may contain spaces and parentheses: parse after the last ')'.
  size_t rp = line.rfind(')');
  if (rp == std::string::npos) return std::nullopt;
  std::istringstream ss(line.substr(rp + 2));
  ProcStat st;
  std::string field;
  ss >> st.state;  // field 3
  // Fields 4 (ppid), 5 (pgrp), ... 22 (starttime).
  long long ppid = 0, pgrp = 0;
  ss >> ppid >> pgrp;
  st.pgid = static_cast<pid_t>(pgrp);
  for (int i = 6; i <= 21 && ss; ++i) ss >> field;
  ss >> st.start_time;
  if (!ss) return std::nullopt;
  return st;
}

bool SameProcessAlive(pid_t pid, uint64_t start_time) {
  if (pid <= 0) return false;
  auto st = ReadProcStat(pid);
  return st && st->state != 'Z' && st->state != 'X' && st->start_time == start_time;
}

std::vector<pid_t> ProcessGroupMembers(pid_t pgid) {
  std::vector<pid_t> out;
  if (pgid <= 0) return out;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  while (struct dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    auto st = ReadProcStat(static_cast<pid_t>(pid));
    if (st && st->pgid == pgid && st->state != 'Z' && st->state != 'X')
      out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

}  // namespace sftctl::agent
