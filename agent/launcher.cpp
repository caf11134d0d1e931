#include "agent/launcher.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace sftctl::agent {

std::string RankFile(const std::string& job_dir, int rank, int src) {
  static const char* kExt[] = {"stdout", "stderr", "events"};
  return job_dir + "/logs/rank-" + std::to_string(rank) + "." + kExt[src];
}

StatusOr<SpawnedRank> SpawnRank(const std::string& trainer, const std::string& job_dir, const RankEnv& env,
                                pid_t pgid) {
  if (::access(trainer.c_str(), X_OK) != 0) return ErrnoError("trainer not executable", trainer, errno);
  int fds[3] = {-1, -1, -1};
  auto close_all = [&]() {
    for (int& fd : fds) {
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
  };
  for (int src = 0; src < 3; ++src) {
    std::string path = RankFile(job_dir, env.rank, src);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      close_all();
      return ErrnoError("cannot open", path, errno);
    }
    // Keep the fds above 3 so dup2 onto 1, 2, 3 never aliases one of them.
    fds[src] = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
    ::close(fd);
    if (fds[src] < 0) {
      close_all();
      return ErrnoError("cannot dup", path, errno);
    }
  }
  // Environment: ours minus the variables we set.
  static const char* kOwn[] = {"RANK",        "WORLD_SIZE",  "LOCAL_RANK",          "LOCAL_WORLD_SIZE",
                               "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"};
  std::vector<std::string> envs;
  for (char** e = environ; e && *e; ++e) {
    bool own = false;
    for (const char* k : kOwn) {
      size_t n = std::strlen(k);
      if (std::strncmp(*e, k, n) == 0 && (*e)[n] == '=') own = true;
    }
    if (!own) envs.emplace_back(*e);
  }
  envs.push_back("RANK=" + std::to_string(env.rank));
  envs.push_back("WORLD_SIZE=" + std::to_string(env.world_size));
  envs.push_back("LOCAL_RANK=" + std::to_string(env.local_rank));
  envs.push_back("LOCAL_WORLD_SIZE=" + std::to_string(env.local_world_size));
  envs.push_back("MASTER_ADDR=" + env.master_addr);
  envs.push_back("MASTER_PORT=" + std::to_string(env.master_port));
  envs.push_back("CUDA_VISIBLE_DEVICES=" + env.cuda_visible_devices);
  std::vector<char*> envp;
  for (std::string& s : envs) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string spec = job_dir + "/spec.json";
  std::vector<std::string> args = {trainer, "train", "--spec", spec, "--events-fd", "3"};
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, fds[0], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawn_file_actions_adddup2(&fa, fds[2], 3);
  posix_spawn_file_actions_addchdir_np(&fa, job_dir.c_str());
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGCHLD, SIGQUIT, SIGUSR1, SIGUSR2})
    sigaddset(&defaults, s);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, pgid);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  int rc = ::posix_spawn(&pid, trainer.c_str(), &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close_all();
  if (rc != 0) return ErrnoError("cannot start trainer", trainer, rc);
  SpawnedRank out;
  out.pid = pid;
  if (auto st = ReadProcStat(pid)) out.start_time = st->start_time;
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
