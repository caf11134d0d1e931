// Issue 49: a test that is killed leaves nothing running. A test program (the guard,
// tests/util/tmpdir_guard.cpp) and a script under sftctl_test_session (tests/util/test_session.cpp)
// start a detached agent the way the e2e tests do (`sftd start --detach`: setsid and a second fork,
// so it is no longer their descendant); each is SIGKILLed, and the agent must be gone within 5 s.
// Also the pieces: a detached process found by its owner token, an orphan of a gone owner found.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/util/command.h"
#include "tests/util/file_util.h"
#include "tests/util/owned_processes.h"
#include "tests/util/temp_dir.h"
#include "tests/util/wait_for.h"

#if defined(__linux__)

namespace sftctl::testing {
namespace {

bool Running(pid_t pid) { return !OwnerToken(pid).empty(); }

pid_t ReadPid(const std::string& path) {
  std::ifstream in(path);
  long pid = 0;
  in >> pid;
  return static_cast<pid_t>(pid);
}

// Starts `argv` with `env` added, output to `log`, not waited for.
pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
            const std::string& log) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
  FILE* out = std::freopen(log.c_str(), "a", stdout);
  if (out != nullptr) ::dup2(::fileno(out), 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execv(args[0], args.data());
  ::_exit(127);
}

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

std::string MyToken() { return OwnerToken(::getpid()); }

std::vector<std::string> SftdStart(const std::string& data_dir) {
  return {Bin("sftd"), "start", "--detach", "--data-dir", data_dir, "--port", "0", "--gpus", "none"};
}

std::string Join(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) out += (out.empty() ? "" : " ") + a;
  return out;
}

// The agent of `data_dir` once `ready` exists (0 when it did not come within 60 s).
pid_t WaitForAgent(const std::string& ready, const std::string& data_dir) {
  if (!WaitFor([&] { return std::ifstream(ready).good(); }, std::chrono::seconds(60))) return 0;
  return ReadPid(data_dir + "/sftd.pid");
}

void KillAndReap(pid_t pid) {
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

TEST(OwnedProcesses, ADetachedChildCarriesTheTestsTokenAndIsKilled) {
  ASSERT_FALSE(MyToken().empty());
  const CommandResult r = RunShell("setsid sleep 301 >/dev/null 2>&1 & echo $!");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const pid_t sleeper = static_cast<pid_t>(std::stol(r.output));
  // (`setsid` execs `sleep` a moment later.)
  const bool found = WaitFor(
      [&] {
        for (const OwnedProcess& p : OwnedProcesses(MyToken())) {
          if (p.pid == sleeper && p.command == "sleep 301") return true;
        }
        return false;
      },
      std::chrono::seconds(5));
  EXPECT_TRUE(found) << DescribeProcesses(OwnedProcesses(MyToken()));
  KillOwned(MyToken());
  EXPECT_TRUE(WaitFor([&] { return !Running(sleeper); }, std::chrono::seconds(5)));
}

TEST(OwnedProcesses, AProcessOfAGoneTestIsAnOrphan) {
  const CommandResult r =
      RunShell(std::string(kTestOwnerVar) + "=999999999.5 setsid sleep 302 >/dev/null 2>&1 & echo $!");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const pid_t sleeper = static_cast<pid_t>(std::stol(r.output));
  EXPECT_FALSE(OwnerAlive("999999999.5"));
  EXPECT_TRUE(OwnerAlive(MyToken()));
  // Found as an orphan, unless a test program starting meanwhile swept it away already.
  EXPECT_TRUE(WaitFor(
      [&] {
        for (const OwnedProcess& p : OrphanedProcesses()) {
          if (p.pid == sleeper) return true;
        }
        return !Running(sleeper);
      },
      std::chrono::seconds(5)));
  TempDir base("sweep");
  SweepLeftovers(base.path(), "AProcessOfAGoneTestIsAnOrphan");
  EXPECT_TRUE(WaitFor([&] { return !Running(sleeper); }, std::chrono::seconds(5)));
  ::kill(sleeper, SIGKILL);
}

// Run by KilledTestProgramLeavesNoAgent (disabled otherwise): starts a detached agent, then hangs.
TEST(TestGuardHelper, DISABLED_StartAgentAndHang) {
  const char* dir = std::getenv("SFTCTL_GUARD_HELPER_DIR");
  if (dir == nullptr) GTEST_SKIP() << "run by TestGuard.KilledTestProgramLeavesNoAgent";
  const CommandResult r = RunCommand(SftdStart(std::string(dir) + "/agent"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ofstream(std::string(dir) + "/ready") << "ready\n";
  std::this_thread::sleep_for(std::chrono::minutes(10));
}

TEST(TestGuard, KilledTestProgramLeavesNoAgent) {
  TempDir tmp("guard-kill");
  const std::string log = tmp.path() + "/helper.log";
  const pid_t helper = Spawn({SelfExe(), "--gtest_also_run_disabled_tests",
                              "--gtest_filter=TestGuardHelper.DISABLED_StartAgentAndHang"},
                             {"TMPDIR=" + tmp.path(), "SFTCTL_GUARD_HELPER_DIR=" + tmp.path()}, log);
  const pid_t agent = WaitForAgent(tmp.path() + "/ready", tmp.path() + "/agent");
  if (agent <= 0) KillAndReap(helper);
  ASSERT_GT(agent, 0) << ReadWholeFile(log);
  ASSERT_TRUE(Running(agent));
  KillAndReap(helper);
  EXPECT_TRUE(WaitFor([&] { return !Running(agent); }, std::chrono::seconds(5)))
      << "the agent of a SIGKILLed test program still runs";
  // The watchdog says what it killed, for the next test program to print (unless a test program
  // that started meanwhile killed the orphan first, and named it in its own log).
  const std::string report = tmp.path() + "/sftctl-survivors-" + std::to_string(helper) + ".txt";
  if (WaitFor([&] { return std::ifstream(report).good(); }, std::chrono::seconds(1))) {
    EXPECT_NE(ReadWholeFile(report).find("sftd"), std::string::npos) << ReadWholeFile(report);
  }
  EXPECT_TRUE(WaitFor([&] { return OwnedProcesses(MyToken()).empty(); }, std::chrono::seconds(5)))
      << DescribeProcesses(OwnedProcesses(MyToken()));
}

TEST(TestSession, KilledSessionLeavesNoAgentNorCommand) {
  TempDir tmp("session-kill");
  const std::string t = tmp.path();
  const std::string script = "echo $$ >" + t + "/shell.pid; " + Join(SftdStart(t + "/agent")) + " && touch " +
                             t + "/ready; exec sleep 600";
  const pid_t session =
      Spawn({Bin("sftctl_test_session"), "/bin/bash", "-c", script}, {"TMPDIR=" + t}, t + "/session.log");
  const pid_t agent = WaitForAgent(t + "/ready", t + "/agent");
  if (agent <= 0) KillAndReap(session);
  ASSERT_GT(agent, 0) << ReadWholeFile(t + "/session.log");
  const pid_t shell = ReadPid(t + "/shell.pid");
  ASSERT_TRUE(Running(agent));
  ASSERT_TRUE(Running(shell));
  KillAndReap(session);
  EXPECT_TRUE(WaitFor([&] { return !Running(agent) && !Running(shell); }, std::chrono::seconds(5)))
      << "still running: agent " << Running(agent) << ", the command " << Running(shell);
  EXPECT_TRUE(WaitFor([&] { return OwnedProcesses(MyToken()).empty(); }, std::chrono::seconds(5)))
      << DescribeProcesses(OwnedProcesses(MyToken()));
}

TEST(TestSession, NamesAndKillsWhatTheCommandLeftRunning) {
  TempDir tmp("session-left");
  const std::string t = tmp.path();
  const CommandResult r = RunCommand({Bin("sftctl_test_session"), "/bin/bash", "-c",
                                      "setsid sleep 303 >/dev/null 2>&1 & echo $! >" + t + "/pid"},
                                     {"TMPDIR=" + t});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("left these processes running"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("sleep 303"), std::string::npos) << r.output;
  const pid_t sleeper = ReadPid(t + "/pid");
  ASSERT_GT(sleeper, 0);
  EXPECT_FALSE(Running(sleeper));
}

TEST(TestSession, FailsACommandThatLeftFilesAndPassesItsStatusOn) {
  TempDir tmp("session-litter");
  const CommandResult litter =
      RunCommand({Bin("sftctl_test_session"), "/bin/sh", "-c", "mkdir \"$TMPDIR/left-behind\""},
                 {"TMPDIR=" + tmp.path()});
  EXPECT_EQ(litter.exit_code, 1);
  EXPECT_NE(litter.output.find("left-behind"), std::string::npos) << litter.output;
  const CommandResult failed =
      RunCommand({Bin("sftctl_test_session"), "/bin/sh", "-c", "exit 7"}, {"TMPDIR=" + tmp.path()});
  EXPECT_EQ(failed.exit_code, 7) << failed.output;
}

}  // namespace
}  // namespace sftctl::testing

#endif  // __linux__
