// The rank launch policy (common/rank_group.h): environment, group start, first failure, stop.
#include "common/rank_group.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/util/file_util.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"
#include "tests/util/wait_for.h"

namespace sftctl {
namespace {

using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::StatusIs;
using ::sftctl::testing::WaitFor;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;
using namespace std::chrono_literals;

RankExit Exited(int code) {
  RankExit e;
  e.known = true;
  e.exit_code = code;
  return e;
}
RankExit Killed(int sig) {
  RankExit e;
  e.known = true;
  e.signal = sig;
  return e;
}

// How many descriptors this process has open.
size_t OpenDescriptors() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

int WaitExit(pid_t pid) {
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return status;
}

// The rest passes through the allowlist of common/os/process_util.h: NCCL_ tuning does, a secret does not.
TEST(RankEnvironmentTest, ReplacesTheRankVariablesAndKeepsTheAllowedRest) {
  const char* inherited[] = {"PATH=/bin",       "RANK=7",          "MASTER_PORT=1",          "RANKING=drop",
                             "NCCL_DEBUG=INFO", "HF_TOKEN=secret", "CUDA_VISIBLE_DEVICES=3", nullptr};
  RankEnv env;
  env.rank = 2;
  env.world_size = 4;
  env.local_rank = 1;
  env.local_world_size = 2;
  env.master_addr = "10.0.0.1";
  env.master_port = 29501;
  EXPECT_THAT(RankEnvironment(env, inherited),
              UnorderedElementsAre("PATH=/bin", "NCCL_DEBUG=INFO", "CUDA_VISIBLE_DEVICES=3", "RANK=2",
                                   "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2",
                                   "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29501"));
  env.cuda_visible_devices = "";  // assigned: no GPU
  std::vector<std::string> hidden = RankEnvironment(env, inherited);
  EXPECT_EQ(std::count(hidden.begin(), hidden.end(), "CUDA_VISIBLE_DEVICES="), 1);
  EXPECT_EQ(std::count(hidden.begin(), hidden.end(), "CUDA_VISIBLE_DEVICES=3"), 0);
}

TEST(RankGroupStopTest, ARankKilledByASignalFailsFirstThenTheLowestRank) {
  RankGroupStop stop(1s);
  EXPECT_FALSE(stop.FirstFailure({{0, Exited(0)}, {1, RankExit{}}}));  // success, unknown: no failure
  auto first = stop.FirstFailure({{0, Exited(1)}, {3, Killed(SIGKILL)}, {2, Killed(SIGSEGV)}});
  ASSERT_TRUE(first);
  EXPECT_EQ(first->rank, 2);
  EXPECT_EQ(FirstFailureReason(*first, ""), "rank 2 failed first: killed by signal 11 (SIGSEGV)");
  // Decided once: a later pass never replaces it.
  EXPECT_FALSE(stop.FirstFailure({{1, Killed(SIGKILL)}}));
  EXPECT_EQ(stop.first_failure()->rank, 2);

  RankGroupStop codes(1s);
  auto lowest = codes.FirstFailure({{3, Exited(2)}, {1, Exited(1)}});
  ASSERT_TRUE(lowest);
  EXPECT_EQ(FirstFailureReason(*lowest, "out of memory"),
            "rank 1 failed first: exit code 1 (trainer error: out of memory)");
  EXPECT_EQ(lowest->exit.ShellCode(), 1);
  EXPECT_EQ(Killed(SIGTERM).ShellCode(), 128 + SIGTERM);
}

TEST(RankGroupStopTest, RanksEndedByAStopDidNotFailOnTheirOwn) {
  RankGroupStop stop(1s);
  EXPECT_TRUE(stop.Begin(Clock::TimePoint{}));  // e.g. a cancel
  EXPECT_FALSE(stop.FirstFailure({{0, Killed(SIGTERM)}, {1, Exited(1)}}));
  EXPECT_FALSE(stop.first_failure());
}

TEST(RankGroupStopTest, TermOnceThenKillOnceAfterTheGrace) {
  RankGroupStop stop(10s);
  const Clock::TimePoint t0{std::chrono::hours(1)};
  EXPECT_EQ(stop.phase(), RankGroupStop::Phase::kRunning);
  EXPECT_FALSE(stop.KillDue(t0 + 1h));  // nothing to kill before a stop
  EXPECT_EQ(stop.UntilKill(t0, 100ms), 100ms);
  EXPECT_TRUE(stop.Begin(t0));
  EXPECT_FALSE(stop.Begin(t0 + 1s));  // SIGTERM once
  EXPECT_EQ(stop.phase(), RankGroupStop::Phase::kTerminating);
  EXPECT_EQ(stop.UntilKill(t0 + 9950ms, 100ms), 50ms);
  EXPECT_FALSE(stop.KillDue(t0 + 9999ms));
  EXPECT_TRUE(stop.KillDue(t0 + 10s));
  EXPECT_FALSE(stop.KillDue(t0 + 11s));  // SIGKILL once
  EXPECT_EQ(stop.phase(), RankGroupStop::Phase::kKilled);
  EXPECT_EQ(stop.UntilKill(t0 + 11s, 100ms), 100ms);
}

TEST(StartRankGroupTest, RanksShareOneGroupTheirEnvironmentFolderAndLogs) {
  ::sftctl::testing::TempDir tmp("rank-group");
  const std::string& dir = tmp.path();
  std::vector<RankCommand> cmds;
  for (int r = 0; r < 3; ++r) {
    RankEnv env;
    env.rank = r;
    env.world_size = 3;
    RankCommand cmd;
    cmd.argv = {"/bin/sh", "-c", "echo out $RANK/$WORLD_SIZE; echo err >&2; echo ev >&3; pwd; exec sleep 30"};
    cmd.env = RankEnvironment(env);
    cmd.cwd = dir;
    const std::string stem = dir + "/rank-" + std::to_string(r);
    ASSERT_TRUE(OpenRankLogs(stem + ".out", stem + ".err", stem + ".events", &cmd).ok());
    for (int fd : {cmd.stdout_fd, cmd.stderr_fd, cmd.events_fd}) EXPECT_GE(fd, 10);
    cmds.push_back(cmd);
  }
  auto pids = StartRankGroup(cmds);
  for (RankCommand& cmd : cmds) CloseRankLogs(&cmd);
  ASSERT_TRUE(pids.ok()) << pids.status().ToString();
  ASSERT_EQ(pids->size(), 3u);
  for (pid_t pid : *pids) EXPECT_EQ(::getpgid(pid), pids->front());
  // Wait for every rank's output (two lines), then stop the whole group with one signal.
  auto all_written = [&] {
    for (int r = 0; r < 3; ++r) {
      const std::string out = ReadWholeFile(dir + "/rank-" + std::to_string(r) + ".out");
      if (std::count(out.begin(), out.end(), '\n') < 2) return false;
    }
    return true;
  };
  ASSERT_TRUE(WaitFor(all_written));
  ASSERT_EQ(::killpg(pids->front(), SIGTERM), 0);
  for (pid_t pid : *pids) {
    int status = WaitExit(pid);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
  }
  const std::string real_dir = std::filesystem::canonical(dir).string();
  for (int r = 0; r < 3; ++r) {
    const std::string stem = dir + "/rank-" + std::to_string(r);
    EXPECT_EQ(ReadWholeFile(stem + ".out"), "out " + std::to_string(r) + "/3\n" + real_dir + "\n");
    EXPECT_EQ(ReadWholeFile(stem + ".err"), "err\n");
    EXPECT_EQ(ReadWholeFile(stem + ".events"), "ev\n");
  }
}

TEST(OpenRankLogsTest, ALogThatCannotBeOpenedIsNamedAndTheOthersAreClosedAgain) {
  ::sftctl::testing::TempDir tmp("rank-logs");
  const size_t open_before = OpenDescriptors();
  const std::string missing = tmp.path() + "/no-such-folder/rank-1.events";
  RankCommand cmd;
  EXPECT_THAT(OpenRankLogs(tmp.path() + "/rank-1.out", tmp.path() + "/rank-1.err", missing, &cmd),
              StatusIs(StatusCode::kNotFound, HasSubstr(missing)));
  EXPECT_EQ(cmd.stdout_fd, -1);
  EXPECT_EQ(cmd.stderr_fd, -1);
  EXPECT_EQ(cmd.events_fd, -1);
  EXPECT_EQ(OpenDescriptors(), open_before) << "the two logs that were opened leaked";
}

TEST(StartRankGroupTest, AProgramThatCannotRunStopsTheGroupAndIsNamed) {
  ::sftctl::testing::TempDir tmp("rank-group");
  const std::string& dir = tmp.path();
  RankCommand sleeper;
  sleeper.argv = {"/bin/sh", "-c", "echo $$ > " + dir + "/pid; exec sleep 30"};
  sleeper.env = RankEnvironment(RankEnv{});
  RankCommand missing = sleeper;
  missing.argv = {dir + "/no-such-trainer"};
  auto pids = StartRankGroup({sleeper, missing});
  EXPECT_THAT(pids.status(), StatusIs(StatusCode::kNotFound, HasSubstr("starting rank 1")));
  EXPECT_THAT(pids.status().message(), HasSubstr(dir + "/no-such-trainer"));
  // Rank 0 was started, then killed and reaped: no child of ours is left.
  errno = 0;
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

}  // namespace
}  // namespace sftctl
