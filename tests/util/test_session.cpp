// sftctl_test_session: what the temporary-folder guard (tests/util/tmpdir_guard.cpp) does for a test
// program, for a test that is a script (cloud.e2e):
//
//   sftctl_test_session COMMAND [ARG...]
//
// It cleans up what an earlier, killed test left (tests/util/owned_processes.h, SweepLeftovers), runs
// COMMAND with $TMPDIR pointing at a folder of its own under $TMPDIR (sftctl-proc-<pid>-XXXXXX) and
// its children marked as its own, with its watchdog started (so that what COMMAND started dies with
// this process however it ends, ctest's SIGKILL at a timeout too). On Linux it is the child subreaper
// of everything COMMAND starts: a daemon that detaches stays in its process tree, which ctest kills at
// a timeout; COMMAND itself gets SIGKILL when this process dies (PR_SET_PDEATHSIG). SIGINT, SIGTERM and
// SIGHUP are passed on to COMMAND's process group.
//
// When COMMAND ends it gives what COMMAND started 3 s to end, then names the processes still running
// on stderr and kills them; names each entry COMMAND left in its folder, and removes the folder
// (SFTCTL_KEEP_TEST_DIRS=1 keeps it). Exit status: COMMAND's (128 + N when a signal N ended it), or 1
// when COMMAND passed but left files in the folder, or 125 when COMMAND could not be started.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>
#include <vector>

#include "tests/util/owned_processes.h"
#include "tests/util/test_paths.h"

namespace {

namespace fs = std::filesystem;
using sftctl::testing::OwnedProcess;

constexpr char kWho[] = "sftctl_test_session";

volatile sig_atomic_t g_child = 0;

void PassOn(int sig) {
  if (g_child > 0) ::kill(-g_child, sig);
}

bool KeepDirs() {
  const char* keep = std::getenv("SFTCTL_KEEP_TEST_DIRS");
  return keep != nullptr && std::string(keep) == "1";
}

// Forks COMMAND in a process group of its own; it dies with this process. -1 when fork failed.
pid_t StartCommand(char** argv) {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid > 0) ::setpgid(pid, pid);  // (both sides: a signal passed on at once finds the group)
  if (pid != 0) return pid;
#if defined(__linux__)
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
  if (::getppid() != parent) ::_exit(125);  // this process died before the signal was armed
  ::setpgid(0, 0);
  ::execvp(argv[0], argv);
  std::cerr << kWho << ": cannot run " << argv[0] << ": " << std::strerror(errno) << "\n";
  ::_exit(125);
}

// Waits for `child`, reaping whatever else ends meanwhile (orphans this subreaper adopted); its
// exit status as a shell reports it.
int WaitCommand(pid_t child) {
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) return 125;
    if (pid == child) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
}

void ReapAll() {
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

// Names and kills what the command left running; true when there was something.
bool EndSurvivors(const std::string& token) {
  if (token.empty()) return false;
  std::vector<OwnedProcess> left = sftctl::testing::WaitOwnedGone(token, std::chrono::seconds(3));
  ReapAll();
  if (left.empty()) return false;
  const std::vector<OwnedProcess> killed = sftctl::testing::KillOwned(token);
  ReapAll();
  if (killed.empty()) return false;
  std::cerr << kWho << ": the test left these processes running; killed them:\n"
            << sftctl::testing::DescribeProcesses(killed);
  return true;
}

// Names the entries left in `dir` and removes the folder (unless kept); true when it held any.
bool EndFolder(const std::string& dir) {
  std::string found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) found += "\n  " + e.path().string();
  if (!found.empty()) std::cerr << kWho << ": the test left litter in $TMPDIR:" << found << "\n";
  if (!KeepDirs()) fs::remove_all(dir, ec);
  return !found.empty();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: " << kWho << " COMMAND [ARG...]\n";
    return 125;
  }
  const char* tmp = std::getenv("TMPDIR");
  const std::string base = tmp != nullptr && *tmp != '\0' ? tmp : sftctl::testing::TestTmpDir();
  std::error_code ec;
  fs::create_directories(base, ec);
  sftctl::testing::SweepLeftovers(base, kWho);
  sftctl::testing::RemoveOrphanFolders(base);
  const std::string dir = sftctl::testing::MakeProgramFolder(base);
  if (dir.empty()) {
    std::cerr << kWho << ": cannot make a folder under " << base << ": " << std::strerror(errno) << "\n";
    return 125;
  }
  ::unsetenv("TMPDIR");  // every copy: an environment may name a variable twice (the last may win)
  ::setenv("TMPDIR", dir.c_str(), 1);
  const std::string token = sftctl::testing::MarkChildren();
  sftctl::testing::StartWatchdog(token, base);
#if defined(__linux__)
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
#endif
  const pid_t child = StartCommand(argv + 1);
  if (child < 0) return 125;
  g_child = child;
  for (int s : {SIGINT, SIGTERM, SIGHUP}) ::signal(s, &PassOn);
  int rc = WaitCommand(child);
  g_child = 0;
  EndSurvivors(token);
  if (EndFolder(dir) && rc == 0) rc = 1;
  return rc;
}
