// The real sftd running the real sftctl-trainer: the contract between agent and trainer
// (spec.json with rewritten output_dir and data blobs, --events-fd 3, checkpoint folders), and multi-rank
// and multi-node jobs whose ranks form one torch.distributed process group.
#include <gtest/gtest.h>

#include <set>

#include "common/sha256.h"
#include "common/spec/spec.h"
#include "tests/agent/agent_test_util.h"
#include "tests/util/fake_hub.h"

namespace sftctl::agent::testing {
namespace {

std::string AdditionData() {
  std::string data;
  for (int i = 0; i < 24; ++i) {
    data += "{\"prompt\": \"What is " + std::to_string(i) + "+1?\\n\", \"completion\": \"" +
            std::to_string(i + 1) + "\"}\n";
  }
  return data;
}

// A tiny CPU training job whose data is an uploaded blob (uploaded to `a` here).
v1::SubmitJobRequest TinyJob(Agent& a, int64_t max_steps, uint32_t cpu_ranks) {
  const std::string data = AdditionData();
  const std::string sha = Sha256Hex(data);
  EXPECT_TRUE(UploadWhole(a, sha, data).ok());
  JobSpec spec;
  spec.name = "tiny";
  spec.output_dir = "/nonexistent/rewritten-by-the-agent";
  spec.tokenizer = "byte";
  spec.precision = "fp32";
  spec.model.config = {{"hidden_size", 32},
                       {"intermediate_size", 64},
                       {"num_hidden_layers", 1},
                       {"num_attention_heads", 4},
                       {"max_position_embeddings", 32}};
  spec.data.train = {"placeholder.jsonl"};
  spec.train.batch_size = 4;
  spec.train.max_steps = max_steps;
  spec.distributed.timeout_s = 60;  // a broken test fails in a minute, not five
  v1::SubmitJobRequest req;
  req.set_spec_json(ToJson(spec).dump());
  req.set_cpu_ranks(cpu_ranks);
  auto* ref = req.add_blobs();
  ref->set_json_pointer("/data/train/0");
  ref->set_sha256(sha);
  return req;
}

// The "start" events of a job, by rank.
std::map<int, nlohmann::json> StartEvents(const std::vector<v1::Event>& events) {
  std::map<int, nlohmann::json> out;
  for (const auto& e : events) {
    if (e.kind() != v1::Event::METRIC) continue;
    auto j = nlohmann::json::parse(e.text(), nullptr, false);
    if (j.is_object() && j.value("event", "") == "start") out[e.rank()] = j;
  }
  return out;
}

TEST(AgentRealTrainer, TrainsATinyJobFromAnUploadedBlobAndServesItsCheckpoint) {
  TempDir dir;
  Agent a(dir.path());
  ASSERT_TRUE(a.Start({"--trainer", Bin("sftctl-trainer")}));

  // Training data travels as a content-addressed blob.
  std::string data;
  for (int i = 0; i < 24; ++i) {
    data += "{\"prompt\": \"What is " + std::to_string(i) + "+1?\\n\", \"completion\": \"" +
            std::to_string(i + 1) + "\"}\n";
  }
  const std::string sha = Sha256Hex(data);
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + a.token());
    v1::BlobStatus resp;
    auto writer = a.stub()->UploadBlob(&ctx, &resp);
    v1::UploadBlobRequest first;
    first.set_sha256(sha);
    first.set_size(data.size());
    ASSERT_TRUE(writer->Write(first));
    v1::UploadBlobRequest chunk;
    chunk.set_data(data);
    ASSERT_TRUE(writer->Write(chunk));
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());
    ASSERT_TRUE(resp.complete());
  }

  // The canonical spec the client would send (the agent rewrites output_dir and the blob path).
  JobSpec spec;
  spec.name = "tiny";
  spec.output_dir = "/nonexistent/rewritten-by-the-agent";
  spec.tokenizer = "byte";
  spec.precision = "fp32";
  spec.model.config = {{"hidden_size", 32},
                       {"intermediate_size", 64},
                       {"num_hidden_layers", 1},
                       {"num_attention_heads", 4},
                       {"max_position_embeddings", 32}};
  spec.data.train = {"placeholder.jsonl"};
  spec.train.batch_size = 4;
  spec.train.max_steps = 3;
  v1::SubmitJobRequest req;
  req.set_spec_json(ToJson(spec).dump());
  req.set_cpu_ranks(1);
  auto* ref = req.add_blobs();
  ref->set_json_pointer("/data/train/0");
  ref->set_sha256(sha);
  v1::Job job;
  grpc::Status s = a.stub()->SubmitJob(a.Ctx().get(), req, &job);
  ASSERT_TRUE(s.ok()) << s.error_message();

  v1::Job done = a.WaitState(job.id(), v1::SUCCEEDED);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_EQ(done.last_step(), 3);
  int steps = 0;
  bool saw_done = false;
  for (const auto& e : a.Events(job.id(), 0, /*follow=*/false)) {
    if (e.kind() != v1::Event::METRIC) continue;
    auto rec = nlohmann::json::parse(e.text());
    steps += rec["event"] == "step";
    saw_done |= rec["event"] == "done";
  }
  EXPECT_EQ(steps, 3);
  EXPECT_TRUE(saw_done);

  v1::ListArtifactsRequest lreq;
  lreq.set_job_id(job.id());
  v1::ListArtifactsResponse list;
  ASSERT_TRUE(a.stub()->ListArtifacts(a.Ctx().get(), lreq, &list).ok());
  bool has_weights = false, has_done = false;
  for (const auto& art : list.artifacts()) {
    has_weights |= art.path().find("checkpoint-000003/model.safetensors") != std::string::npos;
    has_done |= art.path().find("checkpoint-000003/DONE") != std::string::npos;
  }
  EXPECT_TRUE(has_weights && has_done) << list.DebugString();
}

TEST(AgentRealTrainer, TwoCpuRanksTrainOneJob) {
  TempDir dir;
  Agent a(dir.path());
  ASSERT_TRUE(a.Start({"--trainer", Bin("sftctl-trainer")}));
  v1::Job job;
  grpc::Status s = a.stub()->SubmitJob(a.Ctx().get(), TinyJob(a, 3, 2), &job);
  ASSERT_TRUE(s.ok()) << s.error_message();
  v1::Job done = a.WaitJob(job.id(), [](const v1::Job& j) { return j.state() >= v1::SUCCEEDED; });
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_EQ(done.first_failed_rank(), -1);
  EXPECT_EQ(done.last_step(), 3);
  auto events = a.Events(job.id(), 0, false);
  std::set<int> ranks_heard;
  for (const auto& e : events) {
    if (e.kind() != v1::Event::STATE) ranks_heard.insert(e.rank());
  }
  EXPECT_EQ(ranks_heard, (std::set<int>{0, 1})) << "both ranks' output is journaled";
  auto starts = StartEvents(events);
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(starts[0].value("world_size", 0), 2) << starts[0].dump();
  EXPECT_EQ(starts[1].value("world_size", 0), 2) << starts[1].dump();
  EXPECT_EQ(starts[1].value("rank", -1), 1);
  EXPECT_TRUE(std::filesystem::exists(done.job_dir() + "/run/checkpoint-000003/DONE"));
}

TEST(AgentRealTrainer, SigkilledRankFailsTheJobNamingItAndNothingIsLeft) {
  TempDir dir;
  Agent a(dir.path());
  ASSERT_TRUE(a.Start({"--trainer", Bin("sftctl-trainer")}));
  v1::Job job;
  grpc::Status s = a.stub()->SubmitJob(a.Ctx().get(), TinyJob(a, 1000000, 2), &job);
  ASSERT_TRUE(s.ok()) << s.error_message();
  v1::Job running =
      a.WaitJob(job.id(), [](const v1::Job& j) { return j.last_step() >= 1 || j.state() > v1::CANCELLING; });
  ASSERT_EQ(running.state(), v1::RUNNING) << running.reason();
  ASSERT_EQ(running.ranks_size(), 2);
  const pid_t pgid = static_cast<pid_t>(running.ranks(0).pid());
  ::kill(static_cast<pid_t>(running.ranks(1).pid()), SIGKILL);
  v1::Job failed = a.WaitState(job.id(), v1::FAILED);
  KillGroup(GroupMembers(pgid).empty() ? 0 : pgid);  // cleanup should the assertion below fail
  EXPECT_EQ(failed.first_failed_rank(), 1);
  EXPECT_EQ(failed.reason(), "rank 1 failed first: killed by signal 9 (SIGKILL)");
  for (const auto& r : failed.ranks()) {
    EXPECT_FALSE(r.running());
    EXPECT_FALSE(ProcessAlive(static_cast<pid_t>(r.pid()))) << "rank " << r.rank();
  }
}

TEST(AgentRealTrainer, TwoAgentsRunOneJobAsTwoNodes) {
  TempDir d0, d1;
  Agent n0(d0.path()), n1(d1.path());
  ASSERT_TRUE(n0.Start({"--trainer", Bin("sftctl-trainer")}));
  ASSERT_TRUE(n1.Start({"--trainer", Bin("sftctl-trainer")}));
  v1::SubmitJobRequest r0 = TinyJob(n0, 3, 1);
  *r0.mutable_rendezvous() = MakeRendezvous(2, 0, 2, 0, "two-nodes");
  v1::Job j0;
  grpc::Status s = n0.stub()->SubmitJob(n0.Ctx().get(), r0, &j0);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_GT(j0.rendezvous().master_port(), 0u);
  EXPECT_EQ(j0.rendezvous().master_addr(), "127.0.0.1") << "an agent on loopback reports loopback";
  v1::SubmitJobRequest r1 = TinyJob(n1, 3, 1);
  *r1.mutable_rendezvous() =
      MakeRendezvous(2, 1, 2, 1, "two-nodes", j0.rendezvous().master_addr(), j0.rendezvous().master_port());
  v1::Job j1;
  s = n1.stub()->SubmitJob(n1.Ctx().get(), r1, &j1);
  ASSERT_TRUE(s.ok()) << s.error_message();
  auto final_state = [](const v1::Job& j) { return j.state() >= v1::SUCCEEDED; };
  v1::Job done0 = n0.WaitJob(j0.id(), final_state);
  v1::Job done1 = n1.WaitJob(j1.id(), final_state);
  ASSERT_EQ(done0.state(), v1::SUCCEEDED) << done0.reason();
  ASSERT_EQ(done1.state(), v1::SUCCEEDED) << done1.reason();
  EXPECT_EQ(done1.ranks(0).rank(), 1u);
  auto starts = StartEvents(n1.Events(j1.id(), 0, false));
  ASSERT_EQ(starts.count(1), 1u);
  EXPECT_EQ(starts[1].value("world_size", 0), 2);
  EXPECT_TRUE(std::filesystem::exists(done0.job_dir() + "/run/checkpoint-000003/DONE"))
      << "node 0 (rank 0) holds the checkpoint";
  EXPECT_FALSE(std::filesystem::exists(done1.job_dir() + "/run/checkpoint-000003"));
}

// model.path and data.train as hf:// paths: a model the trainer saved is served by a fake Hugging
// Face Hub (tests/util/fake_hub.py, HF_ENDPOINT), downloaded by the agent into its HF cache and
// fine-tuned by the real trainer.
TEST(AgentRealTrainer, FineTunesAModelFromTheHub) {
  TempDir dir;
  std::string base_run;
  {
    Agent a(dir.path() + "/base");
    ASSERT_TRUE(a.Start({"--trainer", Bin("sftctl-trainer")}));
    v1::Job job;
    ASSERT_TRUE(a.stub()->SubmitJob(a.Ctx().get(), TinyJob(a, 2, 1), &job).ok());
    v1::Job done = a.WaitState(job.id(), v1::SUCCEEDED);
    ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
    base_run = done.job_dir() + "/run/checkpoint-000002";
  }
  std::filesystem::create_directories(dir.path() + "/data");
  std::ofstream(dir.path() + "/data/train.jsonl") << AdditionData();
  ::sftctl::testing::FakeHub hub;
  nlohmann::json config = {
      {"repos", {{"org/tiny", {{"dir", base_run}}}, {"datasets/org/data", {{"dir", dir.path() + "/data"}}}}}};
  ASSERT_TRUE(hub.Start(dir.path(), config));
  ::setenv("HF_ENDPOINT", hub.url().c_str(), 1);
  ::setenv("HF_HOME", (dir.path() + "/hf").c_str(), 1);
  Agent a(dir.path() + "/ft");
  const bool started = a.Start({"--trainer", Bin("sftctl-trainer")});
  ::unsetenv("HF_ENDPOINT");
  ::unsetenv("HF_HOME");
  ASSERT_TRUE(started);

  JobSpec spec;
  spec.name = "from-hub";
  spec.tokenizer = "byte";
  spec.precision = "fp32";
  spec.model.path = "hf://org/tiny";
  spec.data.train = {"hf://datasets/org/data/train.jsonl"};
  spec.train.batch_size = 4;
  spec.train.max_steps = 2;
  v1::SubmitJobRequest req;
  req.set_spec_json(ToJson(spec).dump());
  req.set_cpu_ranks(1);
  v1::Job job;
  ASSERT_TRUE(a.stub()->SubmitJob(a.Ctx().get(), req, &job).ok());
  v1::Job done = a.WaitState(job.id(), v1::SUCCEEDED);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_EQ(done.last_step(), 2);
  std::ifstream in(done.job_dir() + "/spec.json");
  const nlohmann::json used = nlohmann::json::parse(in);
  const std::string snapshots = dir.path() + "/hf/hub/models--org--tiny/snapshots/";
  EXPECT_EQ(used["model"]["path"].get<std::string>().rfind(snapshots, 0), 0u) << used["model"]["path"];
  EXPECT_TRUE(std::filesystem::exists(done.job_dir() + "/run/checkpoint-000002/DONE"));
}

}  // namespace
}  // namespace sftctl::agent::testing
