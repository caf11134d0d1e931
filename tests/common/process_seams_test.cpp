// The process seams: ChildExitWatch (pidfd | SIGCHLD self-pipe), ParentDeathSignal (prctl | a
// parent-death pipe watched by a helper process), SelfExePath and the signal-name table. Each
// portable implementation is what macOS runs; here it runs on Linux too.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <gtest/gtest.h>
#include <netinet/in.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <string>

#include "common/os/child_exit_watch.h"
#include "common/os/parent_death.h"
#include "common/os/process_util.h"
#include "common/os/self_exe.h"
#include "tests/util/wait_for.h"

namespace sftctl {
namespace {

using ::sftctl::testing::WaitFor;
using SteadyClock = std::chrono::steady_clock;

long long MsSince(SteadyClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - t).count();
}

pid_t ForkSleeper() {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sleep", "sleep", "30", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

// ---- ChildExitWatch ------------------------------------------------------------------------

class ChildExitWatchTest : public ::testing::TestWithParam<ChildExitWatch::Kind> {};

TEST_P(ChildExitWatchTest, WaitSleepsUntilTheChildExits) {
  auto w = ChildExitWatch::Create(GetParam());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)->kind(), GetParam());
  pid_t pid = ForkSleeper();
  ASSERT_GT(pid, 0);
  (*w)->Watch(pid);
  auto t0 = SteadyClock::now();
  EXPECT_FALSE((*w)->Wait(150));  // still running: the full timeout passes
  EXPECT_GE(MsSince(t0), 140);
  ::kill(pid, SIGKILL);
  t0 = SteadyClock::now();
  EXPECT_TRUE((*w)->Wait(10000));
  EXPECT_LT(MsSince(t0), 5000);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  (*w)->Forget(pid);
  EXPECT_FALSE((*w)->Wait(50));  // nothing left to report
}

TEST_P(ChildExitWatchTest, AChildThatExitedBeforeWaitIsReportedAtOnce) {
  auto w = ChildExitWatch::Create(GetParam());
  ASSERT_TRUE(w.ok());
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(7);
  ASSERT_GT(pid, 0);
  (*w)->Watch(pid);
  // Until it is a zombie (waitid with WNOWAIT leaves it unreaped).
  ASSERT_TRUE(WaitFor([&] {
    siginfo_t info{};
    return ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           info.si_pid == pid;
  }));
  auto t0 = SteadyClock::now();
  EXPECT_TRUE((*w)->Wait(10000));
  EXPECT_LT(MsSince(t0), 1000);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, WNOHANG), pid);  // Wait never reaps
  EXPECT_EQ(WEXITSTATUS(status), 7);
  (*w)->Forget(pid);
}

INSTANTIATE_TEST_SUITE_P(Kind, ChildExitWatchTest,
                         ::testing::Values(ChildExitWatch::Kind::kPidFd, ChildExitWatch::Kind::kSigchldPipe),
                         [](const auto& info) {
                           return info.param == ChildExitWatch::Kind::kPidFd ? "PidFd" : "SigchldPipe";
                         });

std::atomic<int> g_previous_handler_calls{0};
void PreviousHandler(int) { g_previous_handler_calls.fetch_add(1); }

TEST(ChildExitWatchSigchldTest, OneAtATimeChainsAndRestoresThePreviousHandler) {
  struct sigaction mine {
  }, saved{};
  mine.sa_handler = PreviousHandler;
  sigemptyset(&mine.sa_mask);
  ASSERT_EQ(::sigaction(SIGCHLD, &mine, &saved), 0);
  g_previous_handler_calls = 0;
  {
    auto w = ChildExitWatch::Create(ChildExitWatch::Kind::kSigchldPipe);
    ASSERT_TRUE(w.ok());
    auto second = ChildExitWatch::Create(ChildExitWatch::Kind::kSigchldPipe);
    EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
    pid_t pid = ::fork();
    if (pid == 0) ::_exit(0);
    (*w)->Watch(pid);
    EXPECT_TRUE((*w)->Wait(10000));
    ::waitpid(pid, nullptr, 0);
    EXPECT_EQ(g_previous_handler_calls.load(), 1);  // the handler it replaced still ran
  }
  struct sigaction now {};
  ASSERT_EQ(::sigaction(SIGCHLD, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, &PreviousHandler);
  ::sigaction(SIGCHLD, &saved, nullptr);
  // The slot is free again.
  EXPECT_TRUE(ChildExitWatch::Create(ChildExitWatch::Kind::kSigchldPipe).ok());
}

TEST(ChildExitWatchSigchldTest, BestIsPidFdOnLinux) {
  auto w = ChildExitWatch::Create();
  ASSERT_TRUE(w.ok());
#if defined(__linux__)
  EXPECT_EQ((*w)->kind(), ChildExitWatch::Kind::kPidFd);  // every kernel since 5.3
#else
  EXPECT_EQ((*w)->kind(), ChildExitWatch::Kind::kSigchldPipe);
  EXPECT_EQ(ChildExitWatch::Create(ChildExitWatch::Kind::kPidFd).status().code(), StatusCode::kUnimplemented);
#endif
}

// ---- ParentDeathSignal -------------------------------------------------------------------------
#if defined(__linux__)
// A middle process P creates the seam and forks C, which arms it and execs `sleep 30` (or `true`).
// The test process is a subreaper, so C (and the pipe kind's watcher) come back to it once P dies.
class ParentDeathTest : public ::testing::TestWithParam<ParentDeathSignal::Kind> {
 protected:
  void SetUp() override { ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0); }
  void TearDown() override { ::prctl(PR_SET_CHILD_SUBREAPER, 0); }

  // Starts P; returns C's pid (read from P). P exits right after C is armed when `parent_dies`,
  // else it reaps C (which runs `true`) and exits 0.
  pid_t StartMiddle(bool parent_dies, pid_t* middle) {
    int report[2], ready[2];
    if (::pipe(report) != 0 || ::pipe(ready) != 0) return -1;
    const ParentDeathSignal::Kind kind = GetParam();
    *middle = ::fork();
    if (*middle == 0) {
      auto pd = ParentDeathSignal::Create(SIGTERM, kind);
      if (!pd.ok()) ::_exit(2);
      pid_t c = ::fork();
      if (c == 0) {
        if (!(*pd)->ArmInChild()) ::_exit(3);
        (void)!::write(ready[1], "r", 1);
        if (parent_dies) ::execl("/bin/sleep", "sleep", "30", static_cast<char*>(nullptr));
        ::execl("/bin/true", "true", static_cast<char*>(nullptr));
        ::_exit(127);
      }
      char b;
      (void)!::read(ready[0], &b, 1);
      (void)!::write(report[1], &c, sizeof(c));
      if (!parent_dies) ::waitpid(c, nullptr, 0);
      ::_exit(0);
    }
    ::close(report[1]);
    ::close(ready[0]);
    ::close(ready[1]);
    pid_t c = -1;
    if (::read(report[0], &c, sizeof(c)) != sizeof(c)) c = -1;
    ::close(report[0]);
    return c;
  }

  // Reaps every remaining child; false if some are still running after `ms`.
  bool ReapAll(int ms) {
    return WaitFor(
        [] {
          pid_t got;
          while ((got = ::waitpid(-1, nullptr, WNOHANG)) > 0) {
          }
          return got < 0 && errno == ECHILD;
        },
        std::chrono::milliseconds(ms));
  }
};

TEST_P(ParentDeathTest, TheChildGetsTheSignalWhenItsParentDies) {
  pid_t middle = 0;
  pid_t c = StartMiddle(/*parent_dies=*/true, &middle);
  ASSERT_GT(c, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(middle, &status, 0), middle);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  // C was re-parented to this subreaper; it must end by SIGTERM soon (not run `sleep 30`).
  auto t0 = SteadyClock::now();
  pid_t got = 0;
  WaitFor([&] { return (got = ::waitpid(c, &status, WNOHANG)) != 0; }, std::chrono::seconds(10));
  ASSERT_EQ(got, c) << "the child outlived its parent";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;
  EXPECT_LT(MsSince(t0), 5000);
  EXPECT_TRUE(ReapAll(5000)) << "a watcher process was left behind";
}

TEST_P(ParentDeathTest, NothingIsLeftWhenTheChildEndsFirst) {
  pid_t middle = 0;
  pid_t c = StartMiddle(/*parent_dies=*/false, &middle);
  ASSERT_GT(c, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(middle, &status, 0), middle);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  auto t0 = SteadyClock::now();
  EXPECT_TRUE(ReapAll(5000)) << "a watcher process outlived its child";
  EXPECT_LT(MsSince(t0), 3000);
}

INSTANTIATE_TEST_SUITE_P(Kind, ParentDeathTest,
                         ::testing::Values(ParentDeathSignal::Kind::kPrctl, ParentDeathSignal::Kind::kPipe),
                         [](const auto& info) {
                           return info.param == ParentDeathSignal::Kind::kPrctl ? "Prctl" : "Pipe";
                         });
#endif  // __linux__

// ---- SelfExePath, signal names, FreeTcpPort -------------------------------------------------------

TEST(SelfExeTest, IsTheAbsolutePathOfThisTestBinary) {
  auto p = SelfExePath();
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_FALSE(p->empty());
  EXPECT_EQ((*p)[0], '/');
  EXPECT_EQ(p->substr(p->rfind('/') + 1), "portability_seams_test");
  char real[PATH_MAX];
  ASSERT_NE(::realpath(p->c_str(), real), nullptr);
  EXPECT_EQ(*p, std::string(real));  // already symlink-free
  EXPECT_EQ(::access(p->c_str(), X_OK), 0);
}

TEST(SelfExeTest, DirWithSlash) {
  EXPECT_EQ(DirWithSlash("/a/b/sftctl"), "/a/b/");
  EXPECT_EQ(DirWithSlash("/sftctl"), "/");
  EXPECT_EQ(DirWithSlash("sftctl"), "");
}

TEST(SignalNameTest, NamesTheStandardSignalsOnEverySystem) {
  EXPECT_EQ(SignalName(SIGKILL), "SIGKILL");
  EXPECT_EQ(SignalName(SIGTERM), "SIGTERM");
  EXPECT_EQ(SignalName(SIGINT), "SIGINT");
  EXPECT_EQ(SignalName(SIGSEGV), "SIGSEGV");
  EXPECT_EQ(SignalName(SIGABRT), "SIGABRT");
  EXPECT_EQ(SignalName(SIGBUS), "SIGBUS");
  EXPECT_EQ(SignalName(SIGCHLD), "SIGCHLD");
  EXPECT_EQ(SignalName(SIGUSR2), "SIGUSR2");
  EXPECT_EQ(SignalName(SIGXCPU), "SIGXCPU");
}

TEST(SignalNameTest, UnknownNumbersAreSpelledOut) {
  EXPECT_EQ(SignalName(0), "signal 0");
  EXPECT_EQ(SignalName(-3), "signal -3");
  EXPECT_EQ(SignalName(1000), "signal 1000");
  EXPECT_EQ(DescribeExit(0, SIGKILL), "killed by signal 9 (SIGKILL)");
  EXPECT_EQ(DescribeExit(3, 0), "exit code 3");
}

TEST(FreeTcpPortTest, ReturnsAPortThatCanBeBound) {
  int port = FreeTcpPort();
  ASSERT_GT(port, 0);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << port;
  ::close(fd);
}

}  // namespace
}  // namespace sftctl
