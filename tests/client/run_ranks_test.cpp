// `sftctl run --local --ranks N` end to end with the real trainer: N ranks train one job (one run
// folder, one checkpoint), rank > 0 output goes to logs/, and a rank that dies fails the run naming it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "tests/client/tiny_job.h"
#include "tests/trainer/test_util.h"
#include "tests/util/command.h"
#include "tests/util/file_util.h"
#include "tests/util/wait_for.h"

namespace sftctl {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using sftctl::testing::Bin;
using sftctl::testing::MakeTempDir;
using sftctl::testing::ReadMetrics;
using sftctl::testing::ReadWholeFile;
using sftctl::testing::RunShell;
using sftctl::testing::WaitFor;
using sftctl::testing::WriteWholeFile;

// 24 samples: with batch 4 on 2 ranks, 3 steps are exactly one epoch.
std::string WriteSpec(const std::string& dir, const std::string& extra) {
  return sftctl::testing::WriteTinyJobSpec(dir, extra, 24);
}

// Pids of the sftctl-trainer processes whose environment has RANK=<rank> and whose command line
// mentions `needle` (the test's own folder).
std::vector<pid_t> TrainerPids(int rank, const std::string& needle) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = ReadWholeFile(e.path().string() + "/cmdline");
    if (cmd.find("sftctl-trainer") == std::string::npos || cmd.find(needle) == std::string::npos) continue;
    std::string env = ReadWholeFile(e.path().string() + "/environ");
    std::string want = "RANK=" + std::to_string(rank);
    // Entries are NUL-separated; match a whole entry.
    if (env.rfind(want + '\0', 0) == 0 || env.find(std::string(1, '\0') + want + '\0') != std::string::npos)
      out.push_back(std::stoi(name));
  }
  return out;
}

TEST(RunRanks, TwoRanksTrainOneJob) {
  const std::string dir = MakeTempDir("ranks-ok");
  const std::string spec = WriteSpec(dir, "train: {max_steps: 3, batch_size: 4}\n");
  auto r = RunShell(Bin("sftctl") + " run --local --ranks 2 " + spec);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string run = dir + "/runs/job";
  std::vector<std::string> checkpoints;
  for (const auto& e : fs::directory_iterator(run)) {
    if (e.path().filename().string().rfind("checkpoint-", 0) == 0) checkpoints.push_back(e.path().filename());
  }
  EXPECT_EQ(checkpoints, std::vector<std::string>{"checkpoint-000003"});
  EXPECT_TRUE(fs::exists(run + "/checkpoint-000003/DONE"));
  auto metrics = ReadMetrics(run + "/metrics.jsonl");
  ASSERT_FALSE(metrics.empty());
  EXPECT_EQ(metrics.front()["event"], "start");
  EXPECT_EQ(metrics.front().value("world_size", 0), 2) << metrics.front().dump();
  int steps = 0;
  for (const auto& m : metrics) steps += m["event"] == "step";
  EXPECT_EQ(steps, 3) << "rank 0 alone writes the metrics";
  // Rank 1 logs to files, and announced itself on its events descriptor.
  EXPECT_TRUE(fs::exists(run + "/logs/rank-1.out"));
  EXPECT_TRUE(fs::exists(run + "/logs/rank-1.err"));
  auto events1 = ReadMetrics(run + "/logs/rank-1.events");
  ASSERT_FALSE(events1.empty());
  EXPECT_EQ(events1.front()["event"], "start");
  EXPECT_EQ(events1.front().value("rank", -1), 1);
  EXPECT_EQ(events1.front().value("world_size", 0), 2);
}

TEST(RunRanks, KilledRankFailsTheRunNamingIt) {
  const std::string dir = MakeTempDir("ranks-kill");
  const std::string spec = WriteSpec(dir, "train: {max_steps: 100000, batch_size: 4}\n");
  const std::string log = dir + "/sftctl.log";
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    const std::string sftctl = Bin("sftctl");
    ::execl(sftctl.c_str(), sftctl.c_str(), "run", "--local", "--ranks", "2", spec.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Once training is under way (rank 0 reported a step), SIGKILL rank 1.
  bool stepping = WaitFor([&] {
    return ReadWholeFile(dir + "/runs/job/metrics.jsonl").find("\"event\":\"step\"") != std::string::npos;
  });
  std::vector<pid_t> rank1 = TrainerPids(1, dir);
  std::vector<pid_t> rank0 = TrainerPids(0, dir);
  if (!stepping || rank1.size() != 1) ::kill(pid, SIGKILL);
  ASSERT_TRUE(stepping) << ReadWholeFile(log);
  ASSERT_EQ(rank1.size(), 1u) << ReadWholeFile(log);
  ::kill(rank1[0], SIGKILL);
  int status = 0;
  bool exited = WaitFor([&] { return ::waitpid(pid, &status, WNOHANG) == pid; });
  if (!exited) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  ASSERT_TRUE(exited) << "sftctl did not stop the other rank\n" << ReadWholeFile(log);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGKILL);
  const std::string out = ReadWholeFile(log);
  EXPECT_NE(out.find("error: rank 1 failed first: killed by signal 9 (SIGKILL)"), std::string::npos) << out;
  for (pid_t p : rank0)
    EXPECT_FALSE(fs::exists("/proc/" + std::to_string(p) + "/cmdline") &&
                 ReadWholeFile("/proc/" + std::to_string(p) + "/cmdline").find(dir) != std::string::npos)
        << "rank 0 is still running";
}

TEST(RunRanks, BadRanksValueIsRejected) {
  const std::string dir = MakeTempDir("ranks-bad");
  const std::string spec = WriteSpec(dir, "train: {max_steps: 3, batch_size: 4}\n");
  for (const char* v : {"0", "two", "-1", "2x"}) {
    auto r = RunShell(Bin("sftctl") + " run --local --ranks=" + v + " " + spec);
    EXPECT_EQ(r.exit_code, 2) << v;
    EXPECT_NE(r.output.find(std::string("--ranks: expected a positive number or 'auto', got '") + v + "'"),
              std::string::npos)
        << r.output;
  }
  EXPECT_FALSE(fs::exists(dir + "/runs")) << "nothing may be written for a bad --ranks";
}

}  // namespace
}  // namespace sftctl
