// `sftctl submit --slurm` end to end: the real sftctl against a real sftd started with --shared-dir
// on the 2-node test cluster (tests/slurm/slurm_cluster.h), the real trainer as the job's ranks.
// The agent's Slurm poll is 200 ms here (sftd --slurm-poll), so states show up quickly.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/formats/safetensors.h"
#include "common/hub/hf_hub.h"
#include "common/hub/hub_commit.h"
#include "common/os/process_util.h"
#include "tests/client/tiny_job.h"
#include "tests/slurm/slurm_cluster.h"
#include "tests/slurm/weights_diff.h"
#include "tests/util/command.h"
#include "tests/util/fake_hub.h"
#include "tests/util/file_util.h"
#include "tests/util/temp_dir.h"
#include "tests/util/wait_for.h"

namespace sftctl::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSteps3[] =
    "precision: fp32\nthreads: 1\ntrain: {max_steps: 3, batch_size: 4}\ndistributed: {timeout_s: 60}\n";

using ::sftctl::testing::MaxAbsDiff;

// Whether a process runs with its working directory in `dir` (a rank of the job left behind).
bool ProcessIn(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto cwd = std::filesystem::read_symlink(e.path() / "cwd", ec);
    if (!ec && cwd.string().rfind(dir, 0) == 0) return true;
  }
  return false;
}

// Deletes the agent's probe files in `dir` the moment they appear (renamed into place from their
// .tmp), so that no compute node can read them: a shared dir the nodes do not see, on a test cluster
// whose nodes share one machine.
class ProbeEater {
 public:
  explicit ProbeEater(std::string dir) : dir_(std::move(dir)) {
    fd_ = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    ::inotify_add_watch(fd_, dir_.c_str(), IN_MOVED_TO);  // written to a .tmp, renamed into place
    thread_ = std::thread([this] { Run(); });
  }
  ~ProbeEater() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  int eaten() const { return eaten_; }

 private:
  void Run() {
    alignas(inotify_event) char buf[4096];
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const ssize_t n = ::read(fd_, buf, sizeof(buf));
      for (ssize_t off = 0; off < n;) {
        const auto* ev = reinterpret_cast<const inotify_event*>(buf + off);
        const std::string name = ev->len > 0 ? ev->name : "";
        const bool probe = name.rfind(".sftctl-probe-", 0) == 0 && name.find(".tmp") == std::string::npos;
        if (probe && ::unlink((dir_ + "/" + name).c_str()) == 0) ++eaten_;
        off += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
      }
    }
  }
  std::string dir_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> eaten_{0};
  std::thread thread_;
};

class SlurmSubmitTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = SlurmCluster::Start(2).release(); }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(cluster_, nullptr);
    home_ = tmp_.path() + "/home";
    std::filesystem::create_directories(home_);
  }
  void TearDown() override {
    // Nothing of this test may still write into its folders when they are removed: no Slurm job, no agent.
    cluster_->Shell(
        "scancel --user=$(id -un); for i in $(seq 100); do [ -z \"$(squeue -h)\" ] && break; sleep 0.1; "
        "done");
    for (const std::string& d : agents_) RunCommand({Bin("sftd"), "stop", "--data-dir", d});
  }

  // Starts an agent in <tmp>/<name>, with `shared_dir` when not empty, `path` as its PATH when not
  // empty and `env` added to its environment; returns its host for sftctl ("local:DIR").
  std::string StartAgent(const std::string& name, const std::string& shared_dir, const std::string& path = "",
                         const std::vector<std::string>& env = {},
                         const std::vector<std::string>& flags = {}) {
    const std::string dir = tmp_.path() + "/" + name;
    std::vector<std::string> argv = {Bin("sftd"), "start",        "--detach", "--data-dir",
                                     dir,         "--slurm-poll", "200ms"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    if (!shared_dir.empty()) argv.insert(argv.end(), {"--shared-dir", shared_dir});
    if (!path.empty()) argv.insert(argv.begin(), {"/usr/bin/env", "PATH=" + path});  // replaces ours
    std::vector<std::string> agent_env = env;
    agent_env.push_back(cluster_->env());
    const CommandResult r = RunCommand(argv, agent_env);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    agents_.push_back(dir);
    return "local:" + dir;
  }

  std::vector<std::string> Env() const {
    return {"HOME=" + home_, "XDG_CONFIG_HOME=" + home_ + "/config", cluster_->env()};
  }
  CommandResult Sftctl(std::vector<std::string> args) const {
    args.insert(args.begin(), Bin("sftctl"));
    return RunCommand(args, Env());
  }
  // `sftctl logs -f JOB` until the job ends (at most 2 minutes).
  CommandResult FollowLogs(const std::string& job) const {
    return RunCommand({"timeout", "120", Bin("sftctl"), "logs", "-f", job}, Env());
  }
  // `sftctl status JOB --json`'s first node (null when it fails).
  nlohmann::json Status(const std::string& job) const {
    const CommandResult r = RunForStdout({Bin("sftctl"), "status", job, "--json"}, Env());
    nlohmann::json j = nlohmann::json::parse(r.output, nullptr, false);
    return j.is_object() && j.contains("nodes") ? j["nodes"][0] : nlohmann::json();
  }
  // Waits (polling every 100 ms) until `pred(status)`; the last status.
  template <typename Pred>
  nlohmann::json WaitForStatus(const std::string& job, Pred pred,
                               std::chrono::seconds timeout = std::chrono::seconds(90)) {
    nlohmann::json last;
    WaitFor(
        [&] {
          last = Status(job);
          return last.is_object() && pred(last);
        },
        timeout, std::chrono::milliseconds(100));
    return last;
  }
  // Submits `spec` with --slurm and `flags`; the job id ("" after a test failure).
  std::string Submit(const std::string& host, const std::string& spec, std::vector<std::string> flags) {
    std::vector<std::string> argv = {Bin("sftctl"), "submit", "--host", host, "--slurm", "--json"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back(spec);
    const CommandResult r = RunForStdout(argv, Env());
    nlohmann::json j = nlohmann::json::parse(r.output, nullptr, false);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return j.is_object() ? j.value("job", "") : "";
  }
  std::string Squeue() const { return cluster_->Shell("squeue -h -t all -o '%j %T'").output; }

  static SlurmCluster* cluster_;
  TempDir tmp_;
  std::string home_;
  std::vector<std::string> agents_;
};

SlurmCluster* SlurmSubmitTest::cluster_ = nullptr;

TEST_F(SlurmSubmitTest, RefusesBeforeAnythingIsQueued) {
  const std::string spec = WriteTinyJobSpec(tmp_.path(), kSteps3);
  // An agent without --shared-dir.
  CommandResult r = Sftctl({"submit", "--host", StartAgent("plain", ""), "--slurm", "--nodes", "2", spec});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("start sftd with --shared-dir DIR")) << r.output;

  // An unknown partition.
  const std::string shared = tmp_.path() + "/shared";
  const std::string host = StartAgent("agent", shared);
  r = Sftctl({"submit", "--host", host, "--slurm", "--nodes", "2", "--partition", "a100", spec});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output,
              HasSubstr("slurm: field 'partition': unknown partition 'a100'; this cluster has: debug"));

  // A shared dir the compute nodes do not see (the probe file vanishes before a node reads it).
  {
    ProbeEater eater(shared);
    r = Sftctl({"submit", "--host", host, "--slurm", "--nodes", "2", spec});
    EXPECT_NE(r.exit_code, 0);
    EXPECT_THAT(r.output, HasSubstr("slurm: --shared-dir " + std::filesystem::canonical(shared).string() +
                                    " is not visible from the compute nodes: a compute node cannot read"))
        << r.output;
    EXPECT_GE(eater.eaten(), 1);
  }

  // A login node without Slurm's commands: the agent's PATH has a shell and env, nothing else.
  const std::string bare = tmp_.path() + "/bare-path";
  std::filesystem::create_directories(bare);
  std::filesystem::create_symlink("/bin/sh", bare + "/sh");
  std::filesystem::create_symlink("/usr/bin/env", bare + "/env");
  const std::string no_slurm = StartAgent("no-slurm", tmp_.path() + "/shared2", bare);
  r = Sftctl({"submit", "--host", no_slurm, "--slurm", "--nodes", "2", spec});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("this login node has no sbatch")) << r.output;

  // A resume from a bucket, which the login node's agent does not download for a Slurm job yet.
  r = Sftctl(
      {"submit", "--host", host, "--slurm", "--nodes", "2", "--resume-from", "s3://some-bucket/run", spec});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("slurm: resume: s3:// is not supported in a Slurm job yet")) << r.output;

  EXPECT_THAT(Squeue(), Not(HasSubstr("sftctl-job")));
  // Nothing was recorded either.
  r = Sftctl({"list", "--host", host});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr("job-")));
}

TEST_F(SlurmSubmitTest, TwoNodeJobFollowsAndPullsTheWeightsOfATwoRankLocalRun) {
  const std::string spec = WriteTinyJobSpec(tmp_.path(), kSteps3, 24);
  const CommandResult local = RunCommand(
      {Bin("sftctl"), "run", "--local", "--ranks", "2", spec, "-o", tmp_.path() + "/local"}, Env());
  ASSERT_EQ(local.exit_code, 0) << local.output;

  const std::string host = StartAgent("agent", tmp_.path() + "/shared");
  const std::string job = Submit(host, spec, {"--nodes", "2"});
  ASSERT_FALSE(job.empty());
  const CommandResult logs = FollowLogs(job);
  EXPECT_EQ(logs.exit_code, 0) << logs.output;
  EXPECT_THAT(logs.output, HasSubstr("step 3/3: loss"));
  EXPECT_THAT(logs.output, HasSubstr("[rank 1] start:"));  // rank 1's events, from node n2
  EXPECT_THAT(logs.output, HasSubstr("== SUCCEEDED: Slurm job "));

  const nlohmann::json st = Status(job);
  ASSERT_TRUE(st.is_object());
  EXPECT_EQ(st["state"], "SUCCEEDED");
  EXPECT_EQ(st["slurm"]["state"], "COMPLETED");
  EXPECT_EQ(st["last_step"], 3);
  EXPECT_EQ(
      st["job_dir"].get<std::string>().rfind(std::filesystem::canonical(tmp_.path() + "/shared").string(), 0),
      0u);
  const CommandResult text = Sftctl({"status", job});
  EXPECT_THAT(text.output,
              HasSubstr("slurm job " + st["slurm"]["job_id"].get<std::string>() + ": COMPLETED"));

  const std::string out = tmp_.path() + "/pulled";
  const CommandResult pulled = Sftctl({"pull", job, "-o", out});
  ASSERT_EQ(pulled.exit_code, 0) << pulled.output;
  const std::string weights = "/checkpoint-000003/model.safetensors";
  ASSERT_TRUE(std::filesystem::exists(out + weights)) << pulled.output;
  EXPECT_LE(MaxAbsDiff(tmp_.path() + "/local" + weights, out + weights), 1e-6);
}

// checkpoint.upload_to of a Slurm job: the login node's agent watches the run folder in the shared
// dir and, with `checkpoint.upload: final`, commits the last checkpoint's model to the Hub's root with
// the forwarded token.
TEST_F(SlurmSubmitTest, LoginNodeUploadsTheFinalCheckpointToTheHub) {
  FakeHub hub;
  constexpr char kToken[] = "hf_slurm_write_token";
  ASSERT_TRUE(hub.Start(tmp_.path(),
                        {{"token", kToken}, {"write_token", kToken}, {"repos", nlohmann::json::object()}}));
  const std::string spec = WriteTinyJobSpec(tmp_.path(), kSteps3, 24);
  const std::string host = StartAgent("agent", tmp_.path() + "/shared", "",
                                      {"HF_ENDPOINT=" + hub.url(), "HF_HOME=" + home_ + "/agent-hf"});
  std::vector<std::string> argv = {Bin("sftctl"),
                                   "submit",
                                   "--host",
                                   host,
                                   "--slurm",
                                   "--json",
                                   "--nodes",
                                   "2",
                                   "--upload-to",
                                   "hf://org/slurm",
                                   "--set",
                                   "checkpoint.upload=final",
                                   "--forward-hf-token",
                                   spec};
  std::vector<std::string> env = Env();
  env.insert(env.end(), {"HF_TOKEN=" + std::string(kToken), "HF_ENDPOINT=" + hub.url()});
  const CommandResult r = RunForStdout(argv, env);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string job = nlohmann::json::parse(r.output)["job"];
  EXPECT_EQ(FollowLogs(job).exit_code, 0);

  HubOptions o;
  o.endpoint = hub.url();
  o.token = kToken;
  HubCommitter committer(o);
  std::vector<std::string> listed;
  EXPECT_TRUE(WaitFor(
      [&] {
        auto got = committer.ListFiles("org/slurm", "main");
        if (got.ok()) listed = *got;
        return std::find(listed.begin(), listed.end(), "model.safetensors") != listed.end();
      },
      std::chrono::seconds(60), std::chrono::milliseconds(100)))
      << ReadWholeFile(tmp_.path() + "/agent/sftd.log");
  for (const std::string& f : listed) EXPECT_THAT(f, Not(HasSubstr("checkpoint-"))) << f;
  const nlohmann::json st = Status(job);
  ASSERT_TRUE(st.is_object());
  auto ref = ParseHubRef("hf://org/slurm");
  ASSERT_TRUE(ref.ok());
  o.cache_dir = tmp_.path() + "/hf-cache";
  auto snap = HubDownloader(o).Download(*ref);
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  EXPECT_EQ(ReadWholeFile(snap->folder + "/model.safetensors"),
            ReadWholeFile(st["job_dir"].get<std::string>() + "/run/checkpoint-000003/model.safetensors"));
}

TEST_F(SlurmSubmitTest, PendingWhileTheClusterIsFullSurvivesAnAgentRestartAndCancelLeavesNoRank) {
  const std::string spec = WriteTinyJobSpec(
      tmp_.path(), "precision: fp32\nthreads: 1\ntrain: {max_steps: 1000000, batch_size: 4}\n", 24);
  const std::string host = StartAgent("agent", tmp_.path() + "/shared");
  const CommandResult blocker =
      cluster_->Shell("sbatch --parsable -o /dev/null -J blocker -N2 --ntasks-per-node=2 --wrap 'sleep 300'");
  ASSERT_EQ(blocker.exit_code, 0) << blocker.output;
  const std::string blocker_id = blocker.output.substr(0, blocker.output.find_first_of(";\n"));

  const std::string job = Submit(host, spec, {"--nodes", "2"});
  ASSERT_FALSE(job.empty());
  nlohmann::json st = WaitForStatus(
      job, [](const nlohmann::json& s) { return s["slurm"]["state"] == "PENDING (Resources)"; });
  EXPECT_EQ(st["slurm"]["state"], "PENDING (Resources)") << st.dump();
  EXPECT_EQ(st["state"], "QUEUED");
  EXPECT_THAT(Sftctl({"status", job}).output, HasSubstr(": PENDING (Resources)"));

  // A restarted agent finds the Slurm job again and follows it (its output and state below).
  ASSERT_EQ(RunCommand({Bin("sftd"), "stop", "--data-dir", agents_.back()}).exit_code, 0);
  agents_.pop_back();
  ASSERT_EQ(StartAgent("agent", tmp_.path() + "/shared"), host);

  // The cluster frees up: the job runs and trains.
  ASSERT_EQ(cluster_->Shell("scancel " + blocker_id).exit_code, 0);
  st = WaitForStatus(job, [](const nlohmann::json& s) { return s["last_step"].get<int64_t>() >= 2; });
  ASSERT_EQ(st["state"], "RUNNING") << st.dump();
  EXPECT_THAT(st["slurm"]["state"].get<std::string>(), HasSubstr("RUNNING on n[1-2]"));
  const std::string job_dir = st["job_dir"];
  ASSERT_TRUE(ProcessIn(job_dir));

  const CommandResult cancel = Sftctl({"cancel", job});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.output;
  st = WaitForStatus(job, [](const nlohmann::json& s) { return s["state"] == "CANCELLED"; });
  EXPECT_EQ(st["state"], "CANCELLED") << st.dump();
  EXPECT_EQ(st["slurm"]["state"], "CANCELLED");
  EXPECT_TRUE(WaitFor([&] { return !ProcessIn(job_dir); })) << "a rank outlived scancel";
}

// A node fails mid-job: the job without requeue ends FAILED with NODE_FAIL; the one with requeue waits
// in Slurm's queue, runs again once the node is back, resumes from its newest checkpoint and finishes.
TEST_F(SlurmSubmitTest, NodeFailureFailsAJobAndARequeuedOneResumesFromItsCheckpoint) {
  const std::string spec =
      WriteTinyJobSpec(tmp_.path(),
                       "precision: fp32\nthreads: 1\ntrain: {max_steps: 200, batch_size: 4}\n"
                       "checkpoint: {interval: 10, keep: 100}\n",
                       24);
  const std::string host = StartAgent("agent", tmp_.path() + "/shared");
  const std::string requeued = Submit(host, spec, {"--nodes", "2"});
  const std::string once = Submit(host, spec, {"--nodes", "2", "--no-requeue"});
  ASSERT_FALSE(requeued.empty() || once.empty());
  nlohmann::json a = WaitForStatus(requeued, [](const nlohmann::json& s) { return s["last_step"] >= 11; });
  nlohmann::json b = WaitForStatus(once, [](const nlohmann::json& s) { return s["last_step"] >= 1; });
  ASSERT_EQ(a["state"], "RUNNING") << a.dump();
  ASSERT_EQ(b["state"], "RUNNING") << b.dump();
  ASSERT_TRUE(WaitFor([&] {
    return std::filesystem::exists(a["job_dir"].get<std::string>() + "/run/checkpoint-000010/DONE");
  }));

  // The node fails as Slurm sees it (tests/slurm/slurm_engine_e2e_test.cpp kills its slurmd instead,
  // which Slurm notices only after SlurmdTimeout).
  const CommandResult down = cluster_->Shell("scontrol update nodename=n2 state=down reason=sftctl-test");
  ASSERT_EQ(down.exit_code, 0) << down.output;
  b = WaitForStatus(once, [](const nlohmann::json& s) { return s["state"] == "FAILED"; });
  EXPECT_EQ(b["state"], "FAILED") << b.dump();
  EXPECT_EQ(b["slurm"]["state"], "NODE_FAIL (NodeDown)");
  EXPECT_THAT(
      Sftctl({"status", once}).output,
      HasSubstr("FAILED - Slurm job " + b["slurm"]["job_id"].get<std::string>() + ": NODE_FAIL (NodeDown)"));
  // Slurm requeued the other: it waits for two nodes again.
  a = WaitForStatus(requeued, [](const nlohmann::json& s) { return s["state"] == "QUEUED"; });
  EXPECT_EQ(a["state"], "QUEUED") << a.dump();

  // The node comes back: resumed once Slurm has it DOWN (its jobs' steps may still be completing),
  // or on its own when its slurmd registers again (ReturnToService=2).
  const CommandResult back = cluster_->Shell(
      "for i in $(seq 300); do case $(sinfo -h -n n2 -o %T) in idle*|mix*|alloc*) exit 0;; "
      "down*|drain*) scontrol update nodename=n2 state=resume 2>/dev/null;; esac; sleep 0.1; done; "
      "sinfo -h -n n2; exit 1");
  ASSERT_EQ(back.exit_code, 0) << back.output;
  const CommandResult logs = FollowLogs(requeued);
  EXPECT_EQ(logs.exit_code, 0) << logs.output;
  EXPECT_THAT(logs.output, HasSubstr("step 200/200"));
  a = Status(requeued);
  EXPECT_EQ(a["state"], "SUCCEEDED") << a.dump();
  // The second run started from the newest checkpoint the first one completed.
  const std::string events = ReadWholeFile(a["job_dir"].get<std::string>() + "/logs/rank-0.events");
  EXPECT_THAT(events, ::testing::ContainsRegex("\"resumed_from\":\"[^\"]*/run/checkpoint-[0-9]+\""));
}

// A stand-in trainer for the ranks: its environment, NUL-separated, into the job folder.
constexpr char kEnvTrainer[] = R"(#!/bin/sh
env -0 >"logs/env-$RANK"
echo '{"event":"start"}' >&3
)";

// The variables a Slurm rank gets from the launch itself, not from the agent: Slurm's own (SLURM_*,
// SLURMD_NODENAME), torch.distributed's from the script, and bash's.
bool SetByTheLaunch(const std::string& name) {
  static const std::set<std::string> kNames = {
      "RANK",   "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PWD",
      "OLDPWD", "SHLVL",      "_",          "SLURMD_NODENAME"};
  return name.rfind("SLURM_", 0) == 0 || kNames.count(name) != 0;
}

std::filesystem::perms Mode(const std::string& path) {
  return std::filesystem::symlink_status(path).permissions();
}

// Issue 37 (1): the agent's cloud keys never reach a Slurm job; (2): its job folders are private and a
// folder someone else made is never reused, also by a second agent on the same shared dir.
TEST_F(SlurmSubmitTest, RanksGetOnlyTheRankAllowlistInPrivateJobFoldersNeverReused) {
  namespace fs = std::filesystem;
  const std::string trainer = tmp_.path() + "/env-trainer";
  WriteWholeFile(trainer, kEnvTrainer);
  fs::permissions(trainer, fs::perms(0755));
  const std::string shared = tmp_.path() + "/shared";
  const std::vector<std::string> secrets = {"AWS_SECRET_ACCESS_KEY=aws-secret-of-the-agent",
                                            "LAMBDA_API_KEY=lambda-key-of-the-agent",
                                            "SFTCTL_TEST_RANK_MARK=allowlisted"};
  const std::string host = StartAgent("agent", shared, "", secrets, {"--trainer", trainer});
  const std::string spec = WriteTinyJobSpec(tmp_.path(), kSteps3);
  const std::string job = Submit(host, spec, {"--nodes", "2"});
  ASSERT_FALSE(job.empty());
  nlohmann::json st = WaitForStatus(job, [](const nlohmann::json& s) { return s["state"] == "SUCCEEDED"; });
  ASSERT_EQ(st["state"], "SUCCEEDED") << st.dump();
  const std::string job_dir = st["job_dir"];

  for (const char* rank : {"0", "1"}) {
    const std::string env = ReadWholeFile(job_dir + "/logs/env-" + rank);
    std::cout << "rank " << rank << "'s environment:\n";
    std::set<std::string> names;
    for (size_t at = 0, end; at < env.size(); at = end + 1) {
      end = env.find('\0', at);
      if (end == std::string::npos) end = env.size();
      const std::string entry = env.substr(at, end - at);
      std::cout << "  " << entry << "\n";
      const std::string name = entry.substr(0, entry.find('='));
      names.insert(name);
      EXPECT_TRUE(ChildEnvAllowed(name, ChildKind::kRank) || SetByTheLaunch(name))
          << "rank " << rank << " got " << name << ", which is not on the rank allowlist";
    }
    EXPECT_EQ(names.count("AWS_SECRET_ACCESS_KEY"), 0u);
    EXPECT_EQ(names.count("LAMBDA_API_KEY"), 0u);
    EXPECT_THAT(
        env, HasSubstr(std::string("SFTCTL_TEST_RANK_MARK=allowlisted") + '\0'));  // what is allowed arrives
    EXPECT_EQ(names.count("PATH"), 1u);
    EXPECT_THAT(env, HasSubstr(std::string("RANK=") + rank + '\0'));
  }
  for (const std::string& s : secrets)
    EXPECT_THAT(ReadWholeFile(job_dir + "/slurm/job.sbatch"), Not(HasSubstr(s)));

  // Nobody else reads the job's folder, spec, data, script or environment.
  const fs::perms owner_rw = fs::perms::owner_read | fs::perms::owner_write;
  const std::string agent_jobs = fs::path(job_dir).parent_path().string();
  EXPECT_EQ(fs::path(agent_jobs).parent_path().string(), fs::canonical(shared).string() + "/jobs");
  for (const std::string& d :
       {fs::canonical(shared).string() + "/jobs", agent_jobs, job_dir, job_dir + "/slurm"})
    EXPECT_EQ(Mode(d), fs::perms::owner_all) << d;
  for (const std::string& f :
       {job_dir + "/spec.json", job_dir + "/slurm/job.sbatch", job_dir + "/slurm/rank.env"})
    EXPECT_EQ(Mode(f), owner_rw) << f;
  int data_files = 0;
  for (const auto& e : fs::directory_iterator(job_dir + "/inputs/files")) {
    EXPECT_EQ(Mode(e.path().string()), owner_rw) << e.path();
    ++data_files;
  }
  EXPECT_GE(data_files, 1);

  // A job folder that exists already (made by someone else) is refused, not reused.
  const std::string next = agent_jobs + "/job-2";
  fs::create_directories(next);
  WriteWholeFile(next + "/planted", "x");
  const CommandResult refused = Sftctl({"submit", "--host", host, "--slurm", "--nodes", "2", spec});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.output,
              HasSubstr("job-2: cannot create the job folder: '" + next +
                        "' already exists: refusing to reuse a folder this agent did not create"))
      << refused.output;
  const nlohmann::json failed = Status(host + "/job-2");
  EXPECT_EQ(failed["state"], "FAILED") << failed.dump();
  EXPECT_THAT(failed["reason"].get<std::string>(), HasSubstr("cannot create the job folder: '" + next + "'"));
  EXPECT_EQ(failed["job_dir"], fs::canonical(tmp_.path() + "/agent").string() +
                                   "/jobs/job-2");  // its record and journal: the agent's own
  // Nothing was written into the planted folder.
  EXPECT_EQ(std::distance(fs::directory_iterator(next), fs::directory_iterator()), 1);
  EXPECT_THAT(Squeue(), Not(HasSubstr("sftctl-job-2")));

  // A second agent on the same shared dir numbers from job-1 too, in a folder of its own.
  const std::string other = StartAgent("agent2", shared, "", {}, {"--trainer", trainer});
  const std::string job_b = Submit(other, spec, {"--nodes", "2"});
  ASSERT_EQ(job_b, "job-1");
  const nlohmann::json jb = Status(other + "/" + job_b);
  ASSERT_TRUE(jb.is_object()) << "no status of " << other << "/" << job_b;
  const std::string dir_b = jb["job_dir"];
  EXPECT_NE(dir_b, job_dir);
  EXPECT_NE(fs::path(dir_b).parent_path(), fs::path(agent_jobs));
  EXPECT_TRUE(fs::exists(job_dir + "/logs/env-0"));  // the first agent's job-1 untouched
}

}  // namespace
}  // namespace sftctl::testing
