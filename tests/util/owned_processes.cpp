#include "tests/util/owned_processes.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>

#include "tests/util/proc_file.h"

namespace sftctl::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kReportPrefix[] = "sftctl-survivors-";
constexpr char kFolderPrefix[] = "sftctl-proc-";

#if defined(__linux__)

std::vector<std::string> SplitTokens(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string t; std::getline(in, t, ',');) {
    if (!t.empty()) out.push_back(t);
  }
  return out;
}

// The state letter and start time of /proc/<pid>/stat; false when it cannot be read.
bool ReadStat(pid_t pid, char* state, unsigned long long* start) {
  const std::string stat = ReadProcFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return false;
  std::istringstream in(stat.substr(close + 1));
  std::string field;
  in >> *state;
  for (int i = 0; i < 18 && in >> field; ++i) {
  }
  return static_cast<bool>(in >> *start);
}

// The owner tokens in a process's initial environment; empty when it has none or cannot be read.
std::vector<std::string> OwnersOf(pid_t pid) {
  const std::string env = ReadProcFile("/proc/" + std::to_string(pid) + "/environ");
  const std::string key = std::string(kTestOwnerVar) + "=";
  for (size_t at = 0; at < env.size();) {
    const size_t end = std::min(env.find('\0', at), env.size());
    if (env.compare(at, key.size(), key) == 0)
      return SplitTokens(env.substr(at + key.size(), end - at - key.size()));
    at = end + 1;
  }
  return {};
}

std::string CommandOf(pid_t pid) {
  std::string cmd = ReadProcFile("/proc/" + std::to_string(pid) + "/cmdline");
  while (!cmd.empty() && cmd.back() == '\0') cmd.pop_back();
  std::replace(cmd.begin(), cmd.end(), '\0', ' ');
  if (cmd.size() > 300) cmd = cmd.substr(0, 300) + "...";
  return cmd.empty() ? "(no command line)" : cmd;
}

bool Running(pid_t pid) {
  char state = 0;
  unsigned long long start = 0;
  return ReadStat(pid, &state, &start) && state != 'Z' && state != 'X';
}

// The running processes other than this one whose owner tokens satisfy `match`.
template <typename Match>
std::vector<OwnedProcess> Scan(Match match) {
  std::vector<OwnedProcess> out;
  std::error_code ec;
  const pid_t self = ::getpid();
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (pid == self) continue;
    const std::vector<std::string> owners = OwnersOf(pid);
    if (owners.empty() || !match(owners) || !Running(pid)) continue;
    out.push_back({pid, CommandOf(pid)});
  }
  return out;
}

// Closes every descriptor but 0-2 (the watchdog's), which go to /dev/null.
void DetachDescriptors() {
  const int devnull = ::open("/dev/null", O_RDWR);
  for (int fd = 0; fd < 3; ++fd) {
    if (devnull >= 0) ::dup2(devnull, fd);
  }
  const long max = std::clamp<long>(::sysconf(_SC_OPEN_MAX), 256, 65536);
  for (int fd = 3; fd < max; ++fd) ::close(fd);
}

void WriteReport(const std::string& path, pid_t owner, const std::vector<OwnedProcess>& killed) {
  std::ofstream out(path + ".partial");
  out << "test program pid " << owner
      << " ended (killed?) and left these running; the watchdog killed them:\n"
      << DescribeProcesses(killed);
  out.close();
  std::error_code ec;
  fs::rename(path + ".partial", path, ec);
}

[[noreturn]] void RunWatchdog(const std::string& token, const std::string& report_dir) {
  ::setsid();
  DetachDescriptors();
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(s, SIG_IGN);
  while (OwnerAlive(token)) ::poll(nullptr, 0, 250);
  const std::vector<OwnedProcess> killed = KillOwned(token);
  const std::string owner = token.substr(0, token.find('.'));
  if (!killed.empty() && !report_dir.empty()) {
    WriteReport(report_dir + "/" + kReportPrefix + owner + ".txt", std::stoi(owner), killed);
  }
  ::_exit(0);
}

#endif  // __linux__

// Prints and removes the watchdogs' reports under `base`.
void PrintReports(const std::string& base, const std::string& who) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(base, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kReportPrefix, 0) != 0 || e.path().extension() != ".txt") continue;
    std::cerr << who << ": an earlier " << ReadProcFile(e.path().string());
    fs::remove(e.path(), ec);
  }
}

}  // namespace

std::string MakeProgramFolder(const std::string& base) {
  std::string tmpl = (fs::path(base) / (kFolderPrefix + std::to_string(::getpid()) + "-XXXXXX")).string();
  return ::mkdtemp(tmpl.data()) == nullptr ? "" : tmpl;
}

void RemoveOrphanFolders(const std::string& base) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(base, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kFolderPrefix, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + sizeof(kFolderPrefix) - 1, nullptr, 10);
    if (pid <= 0 || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    fs::remove_all(e.path(), rm);
  }
}

std::string DescribeProcesses(const std::vector<OwnedProcess>& procs) {
  std::string out;
  for (const OwnedProcess& p : procs) out += "    pid " + std::to_string(p.pid) + ": " + p.command + "\n";
  return out;
}

#if defined(__linux__)

std::string OwnerToken(pid_t pid) {
  char state = 0;
  unsigned long long start = 0;
  if (!ReadStat(pid, &state, &start) || state == 'Z' || state == 'X') return "";
  return std::to_string(pid) + "." + std::to_string(start);
}

bool OwnerAlive(const std::string& token) {
  const size_t dot = token.find('.');
  if (dot == std::string::npos || dot == 0) return false;
  char* end = nullptr;
  const long pid = std::strtol(token.c_str(), &end, 10);
  if (end != token.c_str() + dot || pid <= 0) return false;
  return OwnerToken(static_cast<pid_t>(pid)) == token;
}

std::string MarkChildren() {
  const std::string token = OwnerToken(::getpid());
  if (token.empty()) return "";
  const char* old = std::getenv(kTestOwnerVar);
  const std::string list = old == nullptr || *old == '\0' ? token : std::string(old) + "," + token;
  ::unsetenv(kTestOwnerVar);  // every copy: an environment may name a variable twice
  ::setenv(kTestOwnerVar, list.c_str(), 1);
  return token;
}

std::vector<OwnedProcess> OwnedProcesses(const std::string& token) {
  if (token.empty()) return {};
  return Scan([&](const std::vector<std::string>& owners) {
    return std::find(owners.begin(), owners.end(), token) != owners.end();
  });
}

std::vector<OwnedProcess> OrphanedProcesses() {
  std::map<std::string, bool> alive;  // token -> whether its owner runs, asked once per scan
  return Scan([&](const std::vector<std::string>& owners) {
    for (const std::string& t : owners) {
      auto it = alive.find(t);
      if (it == alive.end()) it = alive.emplace(t, OwnerAlive(t)).first;
      if (!it->second) return true;
    }
    return false;
  });
}

std::vector<OwnedProcess> KillOwned(const std::string& token, std::chrono::milliseconds patience) {
  std::vector<OwnedProcess> killed;
  std::set<pid_t> seen;
  const auto deadline = std::chrono::steady_clock::now() + patience;
  for (int empty = 0; empty < 2 && std::chrono::steady_clock::now() < deadline;) {
    const std::vector<OwnedProcess> left = OwnedProcesses(token);
    empty = left.empty() ? empty + 1 : 0;
    for (const OwnedProcess& p : left) {
      ::kill(p.pid, SIGKILL);
      if (seen.insert(p.pid).second) killed.push_back(p);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return killed;
}

std::vector<OwnedProcess> WaitOwnedGone(const std::string& token, std::chrono::milliseconds grace) {
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (int empty = 0;;) {
    std::vector<OwnedProcess> left = OwnedProcesses(token);
    empty = left.empty() ? empty + 1 : 0;
    if (empty == 2 || (!left.empty() && std::chrono::steady_clock::now() > deadline)) return left;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

bool StartWatchdog(const std::string& token, const std::string& report_dir) {
  if (token.empty()) return false;
  std::cout.flush();
  std::cerr.flush();
  const pid_t middle = ::fork();
  if (middle < 0) return false;
  if (middle == 0) {
    // A second fork: the watchdog's parent exits at once, so it leaves the test's process tree.
    const pid_t watchdog = ::fork();
    if (watchdog == 0) RunWatchdog(token, report_dir);
    ::_exit(watchdog < 0 ? 1 : 0);
  }
  int status = 0;
  while (::waitpid(middle, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

void SweepLeftovers(const std::string& base, const std::string& who) {
  std::vector<OwnedProcess> orphans = OrphanedProcesses();
  if (!orphans.empty()) {
    for (const OwnedProcess& p : orphans) ::kill(p.pid, SIGKILL);
    std::cerr << who << ": processes of an earlier test that is gone were still running; killed them:\n"
              << DescribeProcesses(orphans);
  }
  PrintReports(base, who);
}

#else  // no /proc: nothing is found, nothing is watched

std::string OwnerToken(pid_t) { return ""; }
bool OwnerAlive(const std::string&) { return false; }
std::string MarkChildren() { return ""; }
std::vector<OwnedProcess> OwnedProcesses(const std::string&) { return {}; }
std::vector<OwnedProcess> OrphanedProcesses() { return {}; }
std::vector<OwnedProcess> KillOwned(const std::string&, std::chrono::milliseconds) { return {}; }
std::vector<OwnedProcess> WaitOwnedGone(const std::string&, std::chrono::milliseconds) { return {}; }
bool StartWatchdog(const std::string&, const std::string&) { return false; }
void SweepLeftovers(const std::string& base, const std::string& who) { PrintReports(base, who); }

#endif  // __linux__

}  // namespace sftctl::testing
