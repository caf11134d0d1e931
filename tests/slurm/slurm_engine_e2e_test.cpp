// The Slurm engine against a real 2-node cluster on 127.0.0.1 (tests/slurm/slurm_cluster.h): the
// rendered sbatch script starts one rank per node with the torch.distributed environment, the real
// CommandRunner submits, queries and cancels, and the states come back as the agent shows them.
// The ranks here are a shell script standing in for sftctl-trainer (it prints its environment);
// slurm_trainer_e2e_test runs the real trainer.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <set>
#include <vector>

#include "agent/process/command_runner.h"
#include "agent/slurm/sbatch_script.h"
#include "agent/slurm/slurm_cli.h"
#include "agent/slurm/slurm_job.h"
#include "common/os/fd_util.h"
#include "common/os/process_util.h"
#include "tests/slurm/slurm_cluster.h"
#include "tests/util/file_util.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"
#include "tests/util/wait_for.h"

namespace sftctl::agent::slurm {
namespace {

using ::sftctl::testing::CommandResult;
using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::StatusIs;
using ::sftctl::testing::WriteWholeFile;
using ::testing::HasSubstr;

// Stands in for sftctl-trainer: prints its environment and arguments; the job folder's `mode` file
// makes rank 1 fail with exit code 3 ("fail") or every rank wait ("wait", after writing its pid to
// up-RANK; "wait-first": only in the job's first run, a requeued run finishes).
// Slurm is asked through a command (squeue/sacct/scontrol): not more often than this.
constexpr std::chrono::milliseconds kSlurmPoll{100};

constexpr const char* kFakeTrainer = R"(#!/bin/bash
echo "rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK lws=$LOCAL_WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT node=$SLURMD_NODENAME args=$*"
echo '{"event":"start"}' >&3
case $(cat mode 2>/dev/null) in
  fail) if [ "$RANK" = 1 ]; then echo "rank 1 gives up" >&2; exit 3; fi; sleep 60 ;;
  wait) echo $$ >"up-$RANK.tmp" && mv "up-$RANK.tmp" "up-$RANK"; exec sleep 300 ;;
  wait-first) if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then echo $$ >"up-$RANK.tmp" && mv "up-$RANK.tmp" "up-$RANK"; exec sleep 300; fi ;;
esac
echo '{"event":"done"}' >&3
)";

class SlurmEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = sftctl::testing::SlurmCluster::Start().release(); }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr); }

  SlurmCli Cli() const { return SlurmCli(runner_.get(), {cluster_->env()}); }
  const std::unique_ptr<CommandRunner> runner_ = CommandRunner::NewPosix(ChildKind::kSlurmCommand);

  // A fresh job folder with the fake trainer, spec.json and `mode` (job_dir_ names it).
  SbatchJob PrepareJob(const std::string& name, const std::string& mode) {
    job_dir_ = sftctl::testing::MakeTempDir("slurm-job");
    const std::string trainer = job_dir_ + "/fake-trainer";
    WriteWholeFile(trainer, kFakeTrainer);
    ::chmod(trainer.c_str(), 0755);
    WriteWholeFile(job_dir_ + "/mode", mode);
    WriteWholeFile(job_dir_ + "/spec.json", "{}\n");
    return SbatchJob{name, job_dir_, trainer, ChildEnvironment(ChildKind::kRank)};
  }
  StatusOr<std::string> Submit(const std::string& name, const std::string& mode,
                               const SlurmOptions& options) {
    return SubmitJobFolder(Cli(), options, PrepareJob(name, mode));
  }

  static SlurmOptions TwoNodes() {
    SlurmOptions o;
    o.nodes = 2;
    return o;
  }

  // Queries `id` until `done` holds (at most `seconds`); the last answer.
  StatusOr<SlurmJobInfo> WaitFor(const std::string& id, const std::function<bool(const SlurmJobInfo&)>& done,
                                 int seconds = 30) {
    StatusOr<SlurmJobInfo> info = NotFoundError("not queried");
    const auto query = [&] {
      info = Cli().Query(id, job_dir_);
      return info.ok() && done(*info);
    };
    if (::sftctl::testing::WaitFor(query, std::chrono::seconds(seconds), kSlurmPoll)) return info;
    ADD_FAILURE() << "job " << id << " still " << (info.ok() ? info->Describe() : info.status().ToString());
    return info;
  }
  StatusOr<SlurmJobInfo> WaitForEnd(const std::string& id) {
    return WaitFor(id, [](const SlurmJobInfo& i) { return IsTerminal(i.state); });
  }
  bool WaitForFile(const std::string& path, int seconds = 30) {
    return ::sftctl::testing::WaitFor([&] { return std::filesystem::exists(path); },
                                      std::chrono::seconds(seconds));
  }

  static sftctl::testing::SlurmCluster* cluster_;
  std::string job_dir_;
};

sftctl::testing::SlurmCluster* SlurmEngineTest::cluster_ = nullptr;

// The MASTER_PORT rank `rank` of the job in `job_dir` saw (the fake trainer's "master=ADDR:PORT"); -1
// when it printed none.
int MasterPort(const std::string& job_dir, int rank) {
  const std::string out = ReadWholeFile(job_dir + "/logs/rank-" + std::to_string(rank) + ".stdout");
  const size_t at = out.rfind("master=");
  const size_t colon = at == std::string::npos ? at : out.find(':', at);
  return colon == std::string::npos ? -1 : std::atoi(out.c_str() + colon + 1);
}

// A listening TCP socket on every interface at `port`, or -1.
int Listen(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::listen(fd, 1) == 0)
    return fd;
  if (fd >= 0) ::close(fd);
  return -1;
}

TEST_F(SlurmEngineTest, TwoNodeJobRunsOneRankPerNodeWithTheDistributedEnvironment) {
  auto id = Submit("sftctl-two", "", TwoNodes());
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*RecordedJobId(job_dir_), *id);
  EXPECT_THAT(ReadWholeFile(ScriptPath(job_dir_)), HasSubstr("#SBATCH --job-name=sftctl-two\n"));
  auto info = WaitForEnd(*id);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->Describe(), "COMPLETED") << ReadWholeFile(BatchOutputPath(job_dir_));
  EXPECT_EQ(info->exit_code, 0);
  EXPECT_THAT(info->note, HasSubstr("no accounting storage"));  // this cluster has no slurmdbd

  const int port = MasterPort(job_dir_, 0);
  EXPECT_GE(port, kPortBase);
  EXPECT_LT(port, kPortBase + kPortSpan);
  const std::string args = " args=train --spec spec.json --events-fd 3\n";
  EXPECT_EQ(ReadWholeFile(job_dir_ + "/logs/rank-0.stdout"),
            "rank=0 world=2 local=0 lws=1 master=127.0.0.1:" + std::to_string(port) + " node=n1" + args);
  EXPECT_EQ(ReadWholeFile(job_dir_ + "/logs/rank-1.stdout"),
            "rank=1 world=2 local=0 lws=1 master=127.0.0.1:" + std::to_string(port) + " node=n2" + args);
  EXPECT_EQ(ReadWholeFile(job_dir_ + "/logs/rank-1.events"), "{\"event\":\"start\"}\n{\"event\":\"done\"}\n");
  EXPECT_EQ(ReadWholeFile(RunsFilePath(job_dir_)), "job=" + *id + " restart=0 rc=0\n");
}

TEST_F(SlurmEngineTest, FailingRankFailsTheJobWithItsExitCode) {
  auto id = Submit("sftctl-fail", "fail", TwoNodes());
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  auto info = WaitForEnd(*id);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->Describe(), "FAILED with exit code 3 (rank 1 on n2)")
      << ReadWholeFile(BatchOutputPath(job_dir_));
  EXPECT_EQ(ReadWholeFile(job_dir_ + "/logs/rank-1.stderr"), "rank 1 gives up\n");
  EXPECT_THAT(ReadWholeFile(RunsFilePath(job_dir_)), HasSubstr("job=" + *id + " restart=0 rc="));
}

TEST_F(SlurmEngineTest, PendingShowsItsReasonAndCancelEndsJobsWithoutLeavingRanks) {
  auto busy = Submit("sftctl-busy", "wait", TwoNodes());
  const std::string busy_dir = job_dir_;
  ASSERT_TRUE(busy.ok()) << busy.status().ToString();
  ASSERT_TRUE(WaitForFile(busy_dir + "/up-0") && WaitForFile(busy_dir + "/up-1"))
      << ReadWholeFile(BatchOutputPath(busy_dir));
  auto running = Cli().Query(*busy, busy_dir);
  ASSERT_TRUE(running.ok());
  EXPECT_EQ(running->Describe(), "RUNNING on n[1-2]");

  auto waiting = Submit("sftctl-waits", "", TwoNodes());
  ASSERT_TRUE(waiting.ok()) << waiting.status().ToString();
  auto pending = WaitFor(*waiting, [](const SlurmJobInfo& i) { return i.reason == "Resources"; });
  ASSERT_TRUE(pending.ok());
  EXPECT_EQ(pending->Describe(), "PENDING (Resources)");
  ASSERT_TRUE(Cli().Cancel(*waiting).ok());
  auto cancelled = WaitForEnd(*waiting);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state, SlurmState::kCancelled);
  EXPECT_FALSE(std::filesystem::exists(job_dir_ + "/logs/rank-0.stdout"))
      << "a cancelled pending job never ran";

  ASSERT_TRUE(Cli().Cancel(*busy).ok());
  job_dir_ = busy_dir;
  auto ended = WaitForEnd(*busy);
  ASSERT_TRUE(ended.ok());
  EXPECT_EQ(ended->Describe(), "CANCELLED");
  for (const char* up : {"/up-0", "/up-1"}) {  // the ranks' pids: gone (not even a zombie is ours)
    const pid_t pid = std::stoi(ReadWholeFile(busy_dir + up));
    EXPECT_TRUE(::sftctl::testing::WaitFor([&] { return ::kill(pid, 0) != 0; }, std::chrono::seconds(10)))
        << "rank process " << pid << " outlived scancel";
  }
  EXPECT_TRUE(Cli().Cancel(*busy).ok()) << "cancelling an ended job is not an error";
}

TEST_F(SlurmEngineTest, RefusesBeforeAnythingIsQueued) {
  SlurmOptions unknown = TwoNodes();
  unknown.partition = "a100";
  EXPECT_THAT(
      Submit("sftctl-refused", "", unknown),
      StatusIs(StatusCode::kInvalidArgument,
               HasSubstr("slurm: field 'partition': unknown partition 'a100'; this cluster has: debug")));
  EXPECT_THAT(RecordedJobId(job_dir_), StatusIs(StatusCode::kNotFound, HasSubstr("no Slurm job id")));

  SlurmOptions three;
  three.nodes = 3;  // the cluster has two
  EXPECT_THAT(
      Submit("sftctl-refused", "", three),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("Slurm refuses the job (sbatch --test-only)")));

  // A login node without Slurm's commands: a PATH with nothing but a shell.
  const std::string bare = sftctl::testing::MakeTempDir("slurm-path");
  std::filesystem::create_symlink("/bin/sh", bare + "/sh");
  SlurmCli no_slurm(runner_.get(), {cluster_->env(), "PATH=" + bare});
  EXPECT_THAT(SubmitJobFolder(no_slurm, TwoNodes(), PrepareJob("sftctl-refused", "")),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("this login node has no sbatch")));

  const auto queued = cluster_->Shell("squeue -h -t all -o %j");
  EXPECT_EQ(queued.exit_code, 0);
  EXPECT_THAT(queued.output, ::testing::Not(HasSubstr("sftctl-refused")));
}

// Two CPU slots per node, so that two 2-node jobs run at once.
class SlurmNodeFailureTest : public SlurmEngineTest {
 protected:
  static void SetUpTestSuite() { cluster_ = sftctl::testing::SlurmCluster::Start(2).release(); }
};

TEST_F(SlurmNodeFailureTest, DeadNodeFailsAJobWithNodeFailAndARequeuedJobRunsAgain) {
  SlurmOptions requeue = TwoNodes();
  auto a = Submit("sftctl-requeue", "wait-first", requeue);
  const std::string requeue_dir = job_dir_;
  SlurmOptions once = TwoNodes();
  once.requeue = false;
  auto b = Submit("sftctl-once", "wait", once);
  const std::string once_dir = job_dir_;
  ASSERT_TRUE(a.ok() && b.ok());
  // Only once every rank runs: a node lost while srun still launches fails the step instead.
  for (const std::string& d : {requeue_dir, once_dir})
    ASSERT_TRUE(WaitForFile(d + "/up-0") && WaitForFile(d + "/up-1")) << ReadWholeFile(BatchOutputPath(d));

  const auto killed = cluster_->KillNode("n2");
  ASSERT_EQ(killed.exit_code, 0) << killed.output;
  job_dir_ = once_dir;
  auto failed = WaitForEnd(*b);
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(failed->Describe(), "NODE_FAIL (NodeDown)");

  job_dir_ = requeue_dir;
  auto requeued = WaitFor(*a, [](const SlurmJobInfo& i) { return i.state == SlurmState::kPending; });
  ASSERT_TRUE(requeued.ok());
  const auto back = cluster_->StartNode("n2");
  ASSERT_EQ(back.exit_code, 0) << back.output;
  auto done = WaitForEnd(*a);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->Describe(), "COMPLETED") << ReadWholeFile(BatchOutputPath(requeue_dir));
  EXPECT_EQ(done->restarts, 1);
  EXPECT_THAT(ReadWholeFile(RunsFilePath(requeue_dir)), HasSubstr("job=" + *a + " restart=1 rc=0\n"));
  // The second run picked a port again, free on its first node.
  EXPECT_THAT(ReadWholeFile(BatchOutputPath(requeue_dir)), HasSubstr("run 1 on n[1-2], master 127.0.0.1:"));
  EXPECT_GE(MasterPort(requeue_dir, 1), kPortBase);
}

// Issue 37: MASTER_PORT was 20000 + job id mod 10000, so two clusters' (or users') jobs that meet on
// a node took the same port. Now the first node picks a port no local socket uses: the ports the old
// rule gives the next jobs are held by listeners here, and the job takes none of them.
TEST_F(SlurmEngineTest, MasterPortIsAPortFreeOnTheFirstNode) {
  const CommandResult probe = cluster_->Shell("sbatch --parsable -o /dev/null -J probe --wrap true");
  ASSERT_EQ(probe.exit_code, 0) << probe.output;
  const int last = std::stoi(probe.output);
  std::vector<UniqueFd> held;
  std::set<int> taken;
  for (int next = last + 1; next <= last + 3; ++next) {
    const int port = kPortBase + next % kPortSpan;
    UniqueFd fd(Listen(port));
    if (!fd.valid()) continue;  // in use already: it counts as taken all the same
    held.push_back(std::move(fd));
    taken.insert(port);
  }
  ASSERT_FALSE(taken.empty());
  auto id = Submit("sftctl-port", "", TwoNodes());
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  ASSERT_LE(std::stoi(*id), last + 3);  // nobody else submits to this cluster
  auto info = WaitForEnd(*id);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->Describe(), "COMPLETED") << ReadWholeFile(BatchOutputPath(job_dir_));
  const int port = MasterPort(job_dir_, 0);
  EXPECT_EQ(taken.count(port), 0u) << "the job took port " << port << ", which a listener holds";
  EXPECT_EQ(MasterPort(job_dir_, 1), port);
}

}  // namespace
}  // namespace sftctl::agent::slurm
