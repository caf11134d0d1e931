// The remote commands end to end against a local agent ("local:<dir>", no SSH): the real sftctl
// starts the real sftd, which runs the real sftctl-trainer on a tiny CPU job.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "client/remote/job_registry.h"
#include "tests/remote/remote_test_util.h"

namespace sftctl::remotetest {
namespace {

class RemoteLocal : public ::testing::Test {
 protected:
  void SetUp() override {
    agent_dir_ = tmp_.path() + "/agent";
    host_ = "local:" + agent_dir_;
    work_ = tmp_.path() + "/work";
    std::filesystem::create_directories(work_);
    std::filesystem::create_directories(tmp_.path() + "/home");
  }
  void TearDown() override {
    // The agent was started detached by sftctl: stop it (jobs have ended or were cancelled).
    std::string cmd = Bin("sftd") + " stop --data-dir " + agent_dir_ + " >/dev/null 2>&1";
    (void)!std::system(cmd.c_str());
  }
  std::string AgentRunFile(const std::string& job, const std::string& rel) const {
    return agent_dir_ + "/jobs/" + job + "/run/" + rel;
  }

  TempDir tmp_;
  std::string agent_dir_, host_, work_;
  Sftctl sftctl_{tmp_.path() + "/home"};
};

TEST_F(RemoteLocal, SubmitFollowPullResumeResubmitStatusListPlot) {
  const std::string spec = WriteTinyJob(work_, /*steps=*/4, /*checkpoint_interval=*/2);

  // submit: both data files are uploaded.
  Result r = sftctl_.Run({"submit", "--host", host_, spec, "--json", "--cpu-ranks", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  nlohmann::json sub = r.Json();
  const std::string job = sub["job"];
  EXPECT_EQ(sub["host"], host_);
  EXPECT_EQ(sub["ref"], host_ + "/" + job);
  EXPECT_EQ(sub["uploaded_files"], 2) << r.All();
  EXPECT_EQ(sub["unchanged_files"], 0);
  EXPECT_EQ(sub["uploaded_bytes"], std::filesystem::file_size(work_ + "/data/train.jsonl") +
                                       std::filesystem::file_size(work_ + "/data/eval.jsonl"));
  // The registry remembers it.
  nlohmann::json reg = nlohmann::json::parse(ReadWholeFile(sftctl_.registry()));
  ASSERT_EQ(reg["jobs"].size(), 1u);
  EXPECT_EQ(reg["jobs"][0]["id"], job);
  EXPECT_EQ(reg["jobs"][0]["host"], host_);

  // logs -f: every event once, in order, ending with SUCCEEDED (exit 0); no --host needed.
  r = sftctl_.Run({"logs", "-f", job, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  auto lines = r.JsonLines();
  std::string why;
  const int64_t n = CheckSeqs(lines, &why);
  ASSERT_GT(n, 0) << why << "\n" << r.All();
  int steps = 0;
  for (const auto& l : lines) steps += l["kind"] == "metric" && l["record"]["event"] == "step";
  EXPECT_EQ(steps, 4);
  EXPECT_EQ(lines.back()["kind"], "state");
  EXPECT_EQ(lines.back()["state"], "SUCCEEDED");
  // The human form: readable step lines and the final state.
  r = sftctl_.Run({"logs", job});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_NE(r.out.find("step 4/4: loss "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("checkpoint at step 2: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("== SUCCEEDED"), std::string::npos) << r.out;
  // --tail N: the last N of those lines; with --json the last N events; with -f on a job that has
  // ended, its state at once.
  const std::string human = r.out;
  r = sftctl_.Run({"logs", job, "--tail", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  const size_t cut = human.rfind('\n', human.rfind('\n', human.size() - 2) - 1);
  EXPECT_EQ(r.out, human.substr(cut + 1));
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;
  r = sftctl_.Run({"logs", job, "--tail", "3", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  auto tail = r.JsonLines();
  ASSERT_EQ(tail.size(), 3u) << r.All();
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(tail[i], lines[lines.size() - 3 + i]);
  r = sftctl_.Run({"logs", "-f", job, "-n", "1"});
  EXPECT_EQ(r.exit_code, 0) << r.All();
  EXPECT_EQ(r.out, human.substr(human.rfind('\n', human.size() - 2) + 1));
  r = sftctl_.Run({"logs", job, "--tail", "0"});
  EXPECT_NE(r.exit_code, 0) << "a tail of 0 lines is refused";

  // pull: the newest checkpoint plus the top-level files, byte-identical to the agent's copies.
  const std::string out = tmp_.path() + "/pulled";
  r = sftctl_.Run({"pull", job, "-o", out, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  nlohmann::json pulled = r.Json();
  EXPECT_EQ(pulled["step"], 4);
  EXPECT_EQ(pulled["files_skipped"], 0);
  const std::vector<std::string> files = ListFiles(out);
  EXPECT_EQ(static_cast<size_t>(pulled["files_fetched"].get<int>()), files.size());
  bool has_weights = false, has_metrics = false, has_spec = false, has_done = false;
  for (const auto& f : files) {
    EXPECT_EQ(Sha(out + "/" + f), Sha(AgentRunFile(job, f))) << f;
    EXPECT_EQ(f.find(".part"), std::string::npos) << f;
    EXPECT_EQ(f.rfind("checkpoint-000002", 0), std::string::npos) << "older checkpoint pulled: " << f;
    has_weights |= f == "checkpoint-000004/model.safetensors";
    has_done |= f == "checkpoint-000004/DONE";
    has_metrics |= f == "metrics.jsonl";
    has_spec |= f == "spec.json";
  }
  EXPECT_TRUE(has_weights && has_done && has_metrics && has_spec) << r.All();

  // A rerun fetches nothing.
  r = sftctl_.Run({"pull", job, "-o", out, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_EQ(r.Json()["files_fetched"], 0);
  EXPECT_EQ(r.Json()["files_skipped"], static_cast<int>(files.size()));

  // A truncated .part is resumed from its size and the result is byte-identical.
  const std::string weights = out + "/checkpoint-000004/model.safetensors";
  const std::string full = ReadWholeFile(weights);
  ASSERT_GT(full.size(), 1000u);
  std::filesystem::remove(weights);
  WriteWholeFile(weights + ".part", full.substr(0, full.size() / 3));
  r = sftctl_.Run({"pull", job, "-o", out, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_EQ(r.Json()["files_fetched"], 1);
  EXPECT_EQ(r.Json()["bytes_fetched"], full.size() - full.size() / 3);
  EXPECT_EQ(ReadWholeFile(weights), full);
  EXPECT_FALSE(std::filesystem::exists(weights + ".part"));

  // A differing file in the way is an error naming it, and stays as it was; --force replaces it.
  WriteWholeFile(out + "/metrics.jsonl", "mine\n");
  r = sftctl_.Run({"pull", job, "-o", out});
  EXPECT_EQ(r.exit_code, 2) << r.All();
  EXPECT_NE(r.err.find("'" + out + "/metrics.jsonl' already exists and differs"), std::string::npos) << r.err;
  EXPECT_EQ(ReadWholeFile(out + "/metrics.jsonl"), "mine\n");
  r = sftctl_.Run({"pull", job, "-o", out, "--force", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_EQ(Sha(out + "/metrics.jsonl"), Sha(AgentRunFile(job, "metrics.jsonl")));

  // --step picks an older complete checkpoint; a missing one is an input error listing the steps.
  r = sftctl_.Run({"pull", job, "--step", "2", "-o", tmp_.path() + "/step2", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_EQ(Sha(tmp_.path() + "/step2/checkpoint-000002/model.safetensors"),
            Sha(AgentRunFile(job, "checkpoint-000002/model.safetensors")));
  r = sftctl_.Run({"pull", job, "--step", "3", "-o", tmp_.path() + "/step3"});
  EXPECT_EQ(r.exit_code, 2) << r.All();
  EXPECT_NE(r.err.find("no complete checkpoint at step 3 (complete: 2, 4)"), std::string::npos) << r.err;

  // A local model folder travels as one blob per file (BlobRef.dir_entry) and becomes a folder on the
  // host: fine-tune the pulled checkpoint further.
  const std::string ckpt = out + "/checkpoint-000004";
  std::string yaml2 = ReadWholeFile(spec);
  yaml2 = yaml2.substr(0, yaml2.find("model:")) + "model:\n  path: " + ckpt + "\n" +
          yaml2.substr(yaml2.find("data:"));
  WriteWholeFile(work_ + "/from_ckpt.yaml", yaml2);
  r = sftctl_.Run({"submit", "--host", host_, work_ + "/from_ckpt.yaml", "--json", "--follow"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  const nlohmann::json sub3 = r.JsonLines().front();
  EXPECT_EQ(sub3["unchanged_files"], 2) << r.All();  // the data files
  EXPECT_EQ(sub3["uploaded_files"], static_cast<int>(ListFiles(ckpt).size())) << r.All();
  EXPECT_EQ(r.JsonLines().back()["state"], "SUCCEEDED") << r.All();
  const nlohmann::json agent_spec = nlohmann::json::parse(
      ReadWholeFile(agent_dir_ + "/jobs/" + sub3["job"].get<std::string>() + "/spec.json"));
  const std::string host_model = agent_spec["model"]["path"];
  ASSERT_EQ(ListFiles(host_model), ListFiles(ckpt));
  for (const auto& f : ListFiles(ckpt)) EXPECT_EQ(Sha(host_model + "/" + f), Sha(ckpt + "/" + f)) << f;

  // Re-submitting with the same data uploads nothing new.
  r = sftctl_.Run({"submit", "--host", host_, spec, "--json", "--cpu-ranks", "1", "--name", "again"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_EQ(r.Json()["uploaded_files"], 0) << r.All();
  EXPECT_EQ(r.Json()["uploaded_bytes"], 0);
  EXPECT_EQ(r.Json()["unchanged_files"], 2);
  const std::string job2 = r.Json()["job"];
  EXPECT_NE(job2, job);
  r = sftctl_.Run({"logs", "-f", job2, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();

  // status, by id, by name and as HOST/JOB.
  r = sftctl_.Run({"status", job, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_EQ(r.Json()["state"], "SUCCEEDED");
  EXPECT_EQ(r.Json()["last_step"], 4);
  EXPECT_EQ(r.Json()["nodes"][0]["ranks"].size(), 1u);
  r = sftctl_.Run({"status", "again", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_EQ(r.Json()["job"], job2);
  r = sftctl_.Run({"status", host_ + "/" + job});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_NE(r.out.find(job + " (tiny): SUCCEEDED"), std::string::npos) << r.out;

  // list: every host in the registry, and --host.
  r = sftctl_.Run({"list", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  ASSERT_EQ(r.Json()["jobs"].size(), 3u) << r.All();
  EXPECT_EQ(r.Json()["jobs"][0]["ref"], host_ + "/" + job);
  EXPECT_EQ(r.Json()["jobs"][2]["name"], "again");
  r = sftctl_.Run({"list", "--host", host_});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_NE(r.out.find(host_ + "/" + job2 + "  again"), std::string::npos) << r.out;

  // plot: a job (metrics fetched from the agent) and a run folder.
  r = sftctl_.Run({"plot", job, "-o", tmp_.path() + "/job.png", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_EQ(PngSize(ReadWholeFile(tmp_.path() + "/job.png")), std::make_pair(960u, 600u));
  r = sftctl_.Run({"plot", out, "-o", tmp_.path() + "/dir.png", "--width", "400", "--height", "300"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_EQ(PngSize(ReadWholeFile(tmp_.path() + "/dir.png")), std::make_pair(400u, 300u));
}

// pull --follow: each newer complete checkpoint while the job runs, the growing metrics.jsonl
// replaced, the newest --keep kept, and the job's state as the exit code; run again, it fetches
// nothing new.
TEST_F(RemoteLocal, PullFollowKeepsTheNewestCheckpointsUntilTheJobEnds) {
  const std::string spec = WriteTinyJob(work_, /*steps=*/60, /*checkpoint_interval=*/6);
  Result r = sftctl_.Run({"submit", "--host", host_, spec, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  const std::string job = r.Json()["job"];
  const std::string out = tmp_.path() + "/synced";
  r = sftctl_.Run({"pull", job, "--follow", "--interval", "0.1", "--keep", "2", "-o", out, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  auto pulls = r.JsonLines();
  ASSERT_FALSE(pulls.empty()) << r.All();
  for (size_t i = 1; i < pulls.size(); ++i) EXPECT_GT(pulls[i]["step"], pulls[i - 1]["step"]) << r.All();
  EXPECT_EQ(pulls.back()["step"], 60) << r.All();
  std::vector<std::string> checkpoints;
  for (const auto& e : std::filesystem::directory_iterator(out)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("checkpoint-", 0) == 0) checkpoints.push_back(name);
  }
  EXPECT_LE(checkpoints.size(), 2u) << ::testing::PrintToString(checkpoints) << r.All();
  EXPECT_TRUE(std::filesystem::exists(out + "/checkpoint-000060/DONE"));
  EXPECT_EQ(Sha(out + "/metrics.jsonl"), Sha(AgentRunFile(job, "metrics.jsonl")));
  EXPECT_EQ(Sha(out + "/checkpoint-000060/model.safetensors"),
            Sha(AgentRunFile(job, "checkpoint-000060/model.safetensors")));
  // Again: the job has ended, everything is here.
  r = sftctl_.Run({"pull", job, "--follow", "-o", out, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  ASSERT_EQ(r.JsonLines().size(), 1u) << r.All();
  EXPECT_EQ(r.JsonLines()[0]["files_fetched"], 0) << r.All();
  // --follow and --step do not mix.
  r = sftctl_.Run({"pull", job, "--follow", "--step", "6"});
  EXPECT_NE(r.exit_code, 0) << r.All();
}

// submit --sync-to: each checkpoint comes home while the job runs, beside --follow's logs; the
// output stays one whole JSON object per line.
TEST_F(RemoteLocal, SubmitSyncToPullsEachCheckpointBesideTheLogs) {
  const std::string spec = WriteTinyJob(work_, /*steps=*/30, /*checkpoint_interval=*/6);
  const std::string out = tmp_.path() + "/synced";
  Result r = sftctl_.Run({"submit", "--host", host_, spec, "--follow", "--sync-to", out, "--sync-interval",
                          "0.1", "--sync-keep", "2", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  const auto lines = r.JsonLines();
  std::string why;
  EXPECT_GT(CheckSeqs(lines, &why), 0) << why << r.All();
  std::vector<int64_t> steps;
  std::string job;
  for (const auto& j : lines) {
    ASSERT_TRUE(j.is_object()) << r.All();
    if (j.contains("checkpoint")) steps.push_back(j["step"].get<int64_t>());
    if (j.contains("nodes")) job = j["job"];
  }
  ASSERT_FALSE(steps.empty()) << r.All();
  EXPECT_EQ(steps.back(), 30) << r.All();
  EXPECT_TRUE(std::is_sorted(steps.begin(), steps.end())) << r.All();
  EXPECT_TRUE(std::filesystem::exists(out + "/checkpoint-000030/DONE"));
  int kept = 0;
  for (const auto& e : std::filesystem::directory_iterator(out)) {
    kept += e.path().filename().string().rfind("checkpoint-", 0) == 0;
  }
  EXPECT_LE(kept, 2) << "--sync-keep 2";
  ASSERT_FALSE(job.empty()) << r.All();
  EXPECT_EQ(Sha(out + "/checkpoint-000030/model.safetensors"),
            Sha(AgentRunFile(job, "checkpoint-000030/model.safetensors")));
  EXPECT_EQ(Sha(out + "/metrics.jsonl"), Sha(AgentRunFile(job, "metrics.jsonl")));

  // Without --follow, the sync alone keeps the command attached until the job ends.
  const std::string out2 = tmp_.path() + "/synced2";
  r = sftctl_.Run({"submit", "--host", host_, spec, "--sync-to", out2, "--sync-interval", "0.1"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_TRUE(std::filesystem::exists(out2 + "/checkpoint-000030/DONE")) << r.All();
  // --sync-interval needs --sync-to.
  r = sftctl_.Run({"submit", "--host", host_, spec, "--sync-interval", "1"});
  EXPECT_NE(r.exit_code, 0) << r.All();
}

// pull --follow across an agent restart: the agent stops mid-job (its ranks run on), the follower
// reconnects (starting the agent again, which re-attaches to the ranks) and brings home the final
// checkpoint.
TEST_F(RemoteLocal, PullFollowCarriesOnAcrossAnAgentRestart) {
  const std::string spec = WriteTinyJob(work_, /*steps=*/1500, /*checkpoint_interval=*/150);
  Result r = sftctl_.Run({"submit", "--host", host_, spec, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  const std::string job = r.Json()["job"];
  const std::string dir = tmp_.path() + "/synced", out = tmp_.path() + "/follow.out",
                    err = tmp_.path() + "/follow.err";
  const pid_t pid = sftctl_.Spawn(
      {"pull", job, "--follow", "--interval", "0.2", "--keep", "1", "-o", dir, "--json"}, out, err);
  ASSERT_TRUE(WaitFor([&] { return ReadWholeFile(out).find("\"step\":") != std::string::npos; }))
      << ReadWholeFile(err);
  const CommandResult stop = RunCommand({Bin("sftd"), "stop", "--data-dir", agent_dir_});
  ASSERT_EQ(stop.exit_code, 0) << stop.output;
  const Result follow = Sftctl::Finish(pid, out, err);
  ASSERT_EQ(follow.exit_code, 0) << follow.All();
  EXPECT_NE(follow.err.find("reconnect"), std::string::npos) << "the agent never went away?\n"
                                                             << follow.All();
  EXPECT_EQ(follow.JsonLines().back()["step"], 1500) << follow.All();
  EXPECT_EQ(Sha(dir + "/checkpoint-001500/model.safetensors"),
            Sha(AgentRunFile(job, "checkpoint-001500/model.safetensors")));
  EXPECT_EQ(Sha(dir + "/metrics.jsonl"), Sha(AgentRunFile(job, "metrics.jsonl")));
}

TEST_F(RemoteLocal, CancelStopsARunningJobAndLogsExitsThree) {
  const std::string spec = WriteTinyJob(work_, /*steps=*/100000);
  Result r = sftctl_.Run({"submit", "--host", host_, spec, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  const std::string job = r.Json()["job"];
  EXPECT_EQ(r.Json()["cpu_ranks"], 1);  // no GPUs: one CPU rank by default
  ASSERT_TRUE(WaitFor([&] {
    Result s = sftctl_.Run({"status", job, "--json"});
    return s.exit_code == 0 && s.Json()["last_step"].get<int64_t>() >= 1;
  })) << "the job never made a step";

  r = sftctl_.Run({"cancel", job, "--wait", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_EQ(r.Json()["nodes"][0]["state"], "CANCELLED");
  r = sftctl_.Run({"logs", "-f", job});
  EXPECT_EQ(r.exit_code, 3) << r.All();
  EXPECT_NE(r.out.find("== CANCELLED"), std::string::npos) << r.out;
  // Cancelling a finished job is refused (exit 5) and says so.
  r = sftctl_.Run({"cancel", job});
  EXPECT_EQ(r.exit_code, 5) << r.All();
  EXPECT_NE(r.out.find("already finished"), std::string::npos) << r.All();
}

TEST_F(RemoteLocal, MultiNodeJobOverTwoAgentsIsOneRegistryEntry) {
  const std::string spec = WriteTinyJob(work_, 3);
  const std::string a0 = "local:" + tmp_.path() + "/a0", a1 = "local:" + tmp_.path() + "/a1";
  struct StopAgents {
    std::string root;
    ~StopAgents() {
      for (const char* d : {"/a0", "/a1"}) {
        std::string cmd = Bin("sftd") + " stop --data-dir " + root + d + " >/dev/null 2>&1";
        (void)!std::system(cmd.c_str());
      }
    }
  } stop{tmp_.path()};
  Result r =
      sftctl_.Run({"submit", "--host", a0, "--host", a1, spec, "--cpu-ranks", "1", "--json", "--follow"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  const nlohmann::json sub = r.JsonLines().front();
  ASSERT_EQ(sub["nodes"].size(), 2u);
  EXPECT_EQ(sub["uploaded_files"], 4);  // both data files to both hosts
  EXPECT_EQ(r.JsonLines().back()["state"], "SUCCEEDED");
  const std::string job = sub["job"];

  nlohmann::json reg = nlohmann::json::parse(ReadWholeFile(sftctl_.registry()));
  ASSERT_EQ(reg["jobs"].size(), 1u);
  ASSERT_EQ(reg["jobs"][0]["nodes"].size(), 2u);
  EXPECT_EQ(reg["jobs"][0]["nodes"][1]["host"], a1);

  r = sftctl_.Run({"status", a0 + "/" + job, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  const nlohmann::json st = r.Json();
  const nlohmann::json& nodes = st["nodes"];
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(r.Json()["state"], "SUCCEEDED");
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(nodes[i]["state"], "SUCCEEDED");
    EXPECT_EQ(nodes[i]["rendezvous"]["node_rank"], i);
    EXPECT_EQ(nodes[i]["rendezvous"]["rank_offset"], i);
    EXPECT_EQ(nodes[i]["rendezvous"]["world_size"], 2);
    EXPECT_EQ(nodes[i]["rendezvous"]["group_id"], nodes[0]["rendezvous"]["group_id"]);
    EXPECT_EQ(nodes[i]["rendezvous"]["master_port"], nodes[0]["rendezvous"]["master_port"]);
  }
  EXPECT_EQ(nodes[1]["ranks"][0]["rank"], 1);
  // Cancel acts on every node: both had finished.
  r = sftctl_.Run({"cancel", a0 + "/" + job, "--json"});
  EXPECT_EQ(r.exit_code, 5) << r.All();
  EXPECT_EQ(r.Json()["nodes"].size(), 2u);
}

TEST_F(RemoteLocal, BadInputIsReportedSpecificallyAndChangesNothing) {
  const std::string spec = WriteTinyJob(work_, 2);
  // No host.
  Result r = sftctl_.Run({"submit", spec});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("give the host to run on: --host HOST"), std::string::npos) << r.err;
  // Missing spec file.
  r = sftctl_.Run({"submit", "--host", host_, work_ + "/nope.yaml"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("spec file '" + work_ + "/nope.yaml' does not exist"), std::string::npos) << r.err;
  // A spec error names file and line.
  WriteWholeFile(work_ + "/bad.yaml", ReadWholeFile(spec) + "bogus_field: 1\n");
  r = sftctl_.Run({"submit", "--host", host_, work_ + "/bad.yaml"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("bad.yaml:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bogus_field"), std::string::npos) << r.err;
  // A missing data file is named.
  std::filesystem::remove(work_ + "/data/eval.jsonl");
  r = sftctl_.Run({"submit", "--host", host_, spec});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("field 'data.eval': file '" + work_ + "/data/eval.jsonl' does not exist"),
            std::string::npos)
      << r.err;
  // A bad --set.
  r = sftctl_.Run({"submit", "--host", host_, spec, "--set", "train.nope=1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--set: unknown field 'train.nope'"), std::string::npos) << r.err;
  // Nothing was started or recorded by any of it.
  EXPECT_FALSE(std::filesystem::exists(agent_dir_));
  EXPECT_FALSE(std::filesystem::exists(sftctl_.registry()));

  // Unknown job: the message names the registry file.
  r = sftctl_.Run({"logs", "job-9"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown job 'job-9': not in the job registry " + sftctl_.registry()),
            std::string::npos)
      << r.err;
  // Unreachable host: no sftd there.
  r = sftctl_.Run({"status", "--host", host_, "--sftd", tmp_.path() + "/no/sftd", "job-1"});
  EXPECT_EQ(r.exit_code, 4) << r.All();
  EXPECT_NE(r.err.find("cannot reach " + host_), std::string::npos) << r.err;
  // A usage error exits 2.
  r = sftctl_.Run({"pull", "job-1", "--step", "1", "--latest"});
  EXPECT_EQ(r.exit_code, 2) << r.All();
}

TEST(RemoteRegistry, AmbiguousIdsListTheCandidatesAndHostJobAlwaysWorks) {
  TempDir tmp;
  const std::string path = tmp.path() + "/cfg/sftctl/jobs.json";
  client::JobRegistry reg(path);
  auto add = [&](const std::string& host, const std::string& id, const std::string& name) {
    client::JobRecord r;
    r.host = host;
    r.id = id;
    r.name = name;
    client::NodeRecord n;
    n.host = host;
    n.id = id;
    r.nodes.push_back(n);
    ASSERT_TRUE(reg.Add(r).ok());
  };
  add("gpu-a", "job-1", "alpha");
  add("local:/tmp/x", "job-1", "beta");
  add("gpu-a", "job-2", "gamma");

  auto r = reg.Resolve("job-1");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "job 'job-1' is ambiguous in the job registry " + path +
                                      ": it could be gpu-a/job-1, local:/tmp/x/job-1; name it as HOST/JOB");
  ASSERT_TRUE(reg.Resolve("local:/tmp/x/job-1").ok());
  EXPECT_EQ(reg.Resolve("local:/tmp/x/job-1")->name, "beta");
  EXPECT_EQ(reg.Resolve("gpu-a/job-1")->name, "alpha");
  EXPECT_EQ(reg.Resolve("job-2")->host, "gpu-a");
  EXPECT_EQ(reg.Resolve("gamma")->id, "job-2");
  EXPECT_EQ(reg.Resolve("job-7").status().code(), StatusCode::kNotFound);

  // The CLI reports the same ambiguity (exit 2) without contacting any host.
  Sftctl sftctl(tmp.path() + "/home");
  std::filesystem::create_directories(tmp.path() + "/home/config/sftctl");
  std::filesystem::copy_file(path, sftctl.registry());
  Result res = sftctl.Run({"status", "job-1"});
  EXPECT_EQ(res.exit_code, 2);
  EXPECT_NE(res.err.find("it could be gpu-a/job-1, local:/tmp/x/job-1"), std::string::npos) << res.err;
}

TEST(RemoteRegistry, ConcurrentAddsLoseNothing) {
  TempDir tmp;
  client::JobRegistry reg(tmp.path() + "/jobs.json");
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        client::JobRecord r;
        r.host = "h" + std::to_string(t);
        r.id = "job-" + std::to_string(i);
        client::NodeRecord n;
        n.host = r.host;
        n.id = r.id;
        r.nodes.push_back(n);
        EXPECT_TRUE(reg.Add(r).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  auto all = reg.Load();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 40u);
}

}  // namespace
}  // namespace sftctl::remotetest
