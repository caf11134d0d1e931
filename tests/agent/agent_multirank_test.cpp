// Multi-rank and multi-node jobs of the real `sftd` with the stub trainer: the torch.distributed
// environment each rank gets, the first failed rank, rendezvous validation and persistence, and folder
// blobs. (agent_real_trainer_test runs the same paths with the real trainer.)
#include <filesystem>
#include <regex>

#include "agent_test_util.h"
#include "common/sha256.h"

namespace sftctl::agent::testing {
namespace {

class AgentMultiRank : public ::testing::Test {
 protected:
  void TearDown() override {
    for (pid_t g : groups_) KillGroup(g);
  }
  void Track(const v1::Job& j) {
    if (j.ranks_size() > 0) groups_.push_back(static_cast<pid_t>(j.ranks(0).pid()));
  }
  grpc::Status SubmitNode(Agent& a, const nlohmann::json& spec, uint32_t cpu_ranks, const v1::Rendezvous& r,
                          v1::Job* job, uint32_t max_restarts = 0) {
    v1::SubmitJobRequest req;
    req.set_spec_json(spec.dump());
    req.set_cpu_ranks(cpu_ranks);
    req.set_max_restarts(max_restarts);
    *req.mutable_rendezvous() = r;
    return a.stub()->SubmitJob(a.Ctx().get(), req, job);
  }
  TempDir dir_;
  std::vector<pid_t> groups_;
};

std::string EnvLine(int rank, int world, int local, int local_world, const std::string& addr, uint32_t port) {
  return "env RANK=" + std::to_string(rank) + " WORLD_SIZE=" + std::to_string(world) +
         " LOCAL_RANK=" + std::to_string(local) + " LOCAL_WORLD_SIZE=" + std::to_string(local_world) +
         " MASTER_ADDR=" + addr + " MASTER_PORT=" + std::to_string(port);
}

// The MASTER_PORT a rank printed, 0 if none.
uint32_t PrintedPort(const std::vector<std::string>& lines) {
  static const std::regex re("^env .* MASTER_PORT=([0-9]+)$");
  for (const auto& l : lines) {
    std::smatch m;
    if (std::regex_match(l, m, re)) return static_cast<uint32_t>(std::stoul(m[1]));
  }
  return 0;
}

bool Has(const std::vector<std::string>& lines, const std::string& want) {
  return std::find(lines.begin(), lines.end(), want) != lines.end();
}

TEST_F(AgentMultiRank, CpuRanksGetTheDistributedEnvAndTheFirstFailedRankIsNamed) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  v1::Job job;
  ASSERT_TRUE(a.Submit(StubSpec({{"mode", "crash"},
                                 {"crash_rank", 1},
                                 {"crash_at", 3},
                                 {"exit_code", 5},
                                 {"steps", 100000},
                                 {"step_ms", 20}}),
                       &job, 0, 2)
                  .ok());
  v1::Job failed = a.WaitState(job.id(), v1::FAILED);
  Track(failed);
  EXPECT_EQ(failed.reason(), "rank 1 failed first: exit code 5 (trainer error: stub crash at step 3)");
  EXPECT_EQ(failed.first_failed_rank(), 1);
  EXPECT_EQ(failed.world_size(), 2u);
  ASSERT_EQ(failed.ranks_size(), 2);
  EXPECT_EQ(failed.ranks(1).exit_code(), 5);
  EXPECT_EQ(failed.ranks(0).signal(), SIGTERM) << "the other rank is stopped";
  EXPECT_TRUE(GroupMembers(static_cast<pid_t>(failed.ranks(0).pid())).empty());

  auto out = StdoutByRank(a.Events(job.id(), 0, false));
  uint32_t port = PrintedPort(out[0]);
  EXPECT_GT(port, 0u);
  EXPECT_TRUE(Has(out[0], EnvLine(0, 2, 0, 2, "127.0.0.1", port))) << ::testing::PrintToString(out[0]);
  EXPECT_TRUE(Has(out[1], EnvLine(1, 2, 1, 2, "127.0.0.1", port))) << ::testing::PrintToString(out[1]);
}

// A rank gets what training needs from the agent's environment, never its secrets (the Hub token,
// the cloud API keys of ~/.config/sftd/env): one allowlist, common/os/process_util.h.
TEST_F(AgentMultiRank, RanksGetTheAllowedEnvironmentAndNoSecret) {
  Agent a(dir_.path());
  a.set_env({"HF_TOKEN=hf_secret", "LAMBDA_API_KEY=lambda_secret", "AWS_SECRET_ACCESS_KEY=aws_secret",
             "SFTD_TEST_OTHER=other", "NCCL_DEBUG=INFO", "OMP_NUM_THREADS=3", "TORCH_SHOW_CPP_STACKTRACES=1",
             "LC_ALL=C.UTF-8", "LD_LIBRARY_PATH=/opt/lib"});
  ASSERT_TRUE(a.Start());
  const nlohmann::json names = {
      "HF_TOKEN",   "LAMBDA_API_KEY",  "AWS_SECRET_ACCESS_KEY",      "SFTD_TEST_OTHER", "PATH",
      "NCCL_DEBUG", "OMP_NUM_THREADS", "TORCH_SHOW_CPP_STACKTRACES", "LC_ALL",          "LD_LIBRARY_PATH",
      "RANK"};
  v1::Job job;
  ASSERT_TRUE(a.Submit(StubSpec({{"steps", 1}, {"print_env", names}}), &job, 0, 2).ok());
  Track(a.WaitState(job.id(), v1::SUCCEEDED));
  auto out = StdoutByRank(a.Events(job.id(), 0, false));
  for (int rank : {0, 1}) {
    const std::vector<std::string>& lines = out[rank];
    for (const char* secret : {"HF_TOKEN", "LAMBDA_API_KEY", "AWS_SECRET_ACCESS_KEY", "SFTD_TEST_OTHER"}) {
      EXPECT_TRUE(Has(lines, std::string("envvar ") + secret + " unset")) << secret << " in rank " << rank;
    }
    for (const char* kept :
         {"envvar NCCL_DEBUG=INFO", "envvar OMP_NUM_THREADS=3", "envvar TORCH_SHOW_CPP_STACKTRACES=1",
          "envvar LC_ALL=C.UTF-8", "envvar LD_LIBRARY_PATH=/opt/lib"}) {
      EXPECT_TRUE(Has(lines, kept)) << kept << " in rank " << rank << ": " << ::testing::PrintToString(lines);
    }
    EXPECT_TRUE(Has(lines, "envvar RANK=" + std::to_string(rank)));
    EXPECT_TRUE(std::any_of(lines.begin(), lines.end(),
                            [](const std::string& l) { return l.rfind("envvar PATH=/", 0) == 0; }));
  }
}

TEST_F(AgentMultiRank, TwoNodesGetGlobalRanksAndNodeZerosMasterWhichSurvivesARestart) {
  Agent a(dir_.path());
  // Node 0 advertises the address its ranks use too (the client may tell other nodes another name).
  ASSERT_TRUE(a.Start({"--rendezvous-addr", "node0.example"}));
  v1::Job n0, n1;
  grpc::Status s =
      SubmitNode(a, StubSpec({{"steps", 3}}), 2, MakeRendezvous(2, 0, 3, 0), &n0, /*max_restarts=*/2);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(n0.rendezvous().master_addr(), "node0.example");
  const uint32_t port = n0.rendezvous().master_port();
  EXPECT_GT(port, 0u);
  EXPECT_LT(port, 65536u);
  EXPECT_EQ(n0.max_restarts(), 0u) << "a multi-node job never restarts";
  EXPECT_EQ(n0.world_size(), 3u);
  EXPECT_EQ(n0.rendezvous().group_id(), "g1");
  // Node 1 (here on the same agent) uses node 0's port with the address the client knows.
  s = SubmitNode(a, StubSpec({{"steps", 3}}), 1, MakeRendezvous(2, 1, 3, 2, "g1", "127.0.0.1", port), &n1);
  ASSERT_TRUE(s.ok()) << s.error_message();

  v1::Job d0 = a.WaitState(n0.id(), v1::SUCCEEDED);
  v1::Job d1 = a.WaitState(n1.id(), v1::SUCCEEDED);
  EXPECT_EQ(d0.first_failed_rank(), -1);
  ASSERT_EQ(d1.ranks_size(), 1);
  EXPECT_EQ(d1.ranks(0).rank(), 2u) << "ranks are global";
  EXPECT_TRUE(std::filesystem::exists(d1.job_dir() + "/logs/rank-2.stdout"));
  auto out0 = StdoutByRank(a.Events(n0.id(), 0, false));
  auto out1 = StdoutByRank(a.Events(n1.id(), 0, false));
  EXPECT_TRUE(Has(out0[0], EnvLine(0, 3, 0, 2, "node0.example", port))) << ::testing::PrintToString(out0[0]);
  EXPECT_TRUE(Has(out0[1], EnvLine(1, 3, 1, 2, "node0.example", port))) << ::testing::PrintToString(out0[1]);
  EXPECT_TRUE(Has(out1[2], EnvLine(2, 3, 0, 1, "127.0.0.1", port))) << ::testing::PrintToString(out1[2]);

  // The rendezvous is part of the job's durable state.
  a.Stop();
  Agent b(dir_.path());
  ASSERT_TRUE(b.Start());
  v1::Job after = b.Get(n1.id());
  EXPECT_EQ(after.rendezvous().SerializeAsString(), d1.rendezvous().SerializeAsString());
  EXPECT_EQ(after.rendezvous().rank_offset(), 2u);
  EXPECT_EQ(b.Get(n0.id()).rendezvous().master_port(), port);
}

TEST_F(AgentMultiRank, BadRendezvousIsInvalidArgumentNamingTheField) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  struct Case {
    v1::Rendezvous r;
    uint32_t cpu_ranks;
    std::string message;
  };
  const std::vector<Case> cases = {
      {MakeRendezvous(2, 0, 2, 0, ""), 1,
       "rendezvous.group_id: must not be empty (the same string on every node)"},
      {MakeRendezvous(2, 2, 2, 1, "g", "h", 1), 1, "rendezvous.node_rank: 2 must be less than num_nodes (2)"},
      {MakeRendezvous(2, 1, 2, 1, "g", "h", 1), 2,
       "rendezvous.rank_offset: rank_offset 1 + 2 rank(s) on this node exceeds world_size 2"},
      {MakeRendezvous(2, 0, 2, 1), 1, "rendezvous.rank_offset: must be 0 on node 0 (it hosts rank 0)"},
      {MakeRendezvous(2, 1, 2, 1, "g", "", 29500), 1,
       "rendezvous.master_addr: required on node_rank > 0 (node 0's Job.rendezvous.master_addr)"},
      {MakeRendezvous(2, 1, 2, 1, "g", "h", 0), 1,
       "rendezvous.master_port: required on node_rank > 0 (node 0's Job.rendezvous.master_port)"},
      {MakeRendezvous(3, 0, 2, 0), 1, "rendezvous.world_size: 2 must be at least num_nodes (3)"},
  };
  for (const Case& c : cases) {
    v1::Job job;
    grpc::Status s = SubmitNode(a, StubSpec({{"steps", 1}}), c.cpu_ranks, c.r, &job);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.message;
    EXPECT_EQ(s.error_message(), c.message);
  }
  v1::ListJobsResponse list;
  ASSERT_TRUE(a.stub()->ListJobs(a.Ctx().get(), v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 0) << "rejected submissions leave no job behind";
}

TEST_F(AgentMultiRank, FolderOfBlobsIsOneFolderInTheJobDir) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  const std::string config = "config-bytes", tok = "tokenizer-bytes";
  ASSERT_TRUE(UploadWhole(a, Sha256Hex(config), config).ok());
  ASSERT_TRUE(UploadWhole(a, Sha256Hex(tok), tok).ok());
  nlohmann::json spec = StubSpec({});
  spec["model"] = {{"path", "/client/side/model"}};  // the stub lists the folder it becomes
  v1::SubmitJobRequest req;
  req.set_spec_json(spec.dump());
  auto add = [&](const std::string& sha, const std::string& entry) {
    auto* ref = req.add_blobs();
    ref->set_json_pointer("/model/path");
    ref->set_sha256(sha);
    ref->set_dir_entry(entry);
  };
  add(Sha256Hex(config), "config.json");
  add(Sha256Hex(tok), "sub/tokenizer.json");
  v1::Job job;
  grpc::Status s = a.stub()->SubmitJob(a.Ctx().get(), req, &job);
  ASSERT_TRUE(s.ok()) << s.error_message();
  v1::Job done = a.WaitState(job.id(), v1::SUCCEEDED);
  EXPECT_EQ(nlohmann::json::parse(done.spec_json())["model"]["path"], done.job_dir() + "/inputs/0");
  auto out = StdoutByRank(a.Events(job.id(), 0, false));
  EXPECT_TRUE(Has(out[0], "entry config.json config-bytes")) << ::testing::PrintToString(out[0]);
  EXPECT_TRUE(Has(out[0], "entry sub/tokenizer.json tokenizer-bytes")) << ::testing::PrintToString(out[0]);

  // Entries escaping the folder are refused, naming the field.
  add(Sha256Hex(tok), "../escape.json");
  s = a.stub()->SubmitJob(a.Ctx().get(), req, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "blobs[2].dir_entry: unsafe path '../escape.json': has a '..' component");
}

}  // namespace
}  // namespace sftctl::agent::testing
