// hf:// paths through the real sftd (with the stub trainer) and a fake Hugging Face Hub on 127.0.0.1
// (tests/util/fake_hub.py; HF_ENDPOINT points the agent at it): the agent downloads a gated model and
// a data set file into the host's HF cache before the trainer starts, with the client's token, which
// reaches only the Hub and is never written to the agent's database, journal, job files or log.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/agent/agent_test_util.h"
#include "tests/util/fake_hub.h"
#include "tests/util/file_util.h"

namespace sftctl::agent::testing {
namespace {

using ::sftctl::testing::FakeHub;
using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::WriteWholeFile;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr const char* kToken = "hf_agent_test_token_5f1c";

class AgentHubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string model = dir_.path() + "/repo-model";
    WriteWholeFile(model + "/config.json", R"({"model_type": "qwen2"})");
    WriteWholeFile(model + "/model.safetensors", "safetensors bytes of a tiny model");
    WriteWholeFile(model + "/pytorch_model.bin", "not fetched");
    WriteWholeFile(dir_.path() + "/repo-data/train.jsonl", "{\"text\": \"hello\"}\n");
    nlohmann::json config = {{"token", kToken},
                             {"repos",
                              {{"org/tiny", {{"dir", model}, {"gated", true}}},
                               {"datasets/org/data", {{"dir", dir_.path() + "/repo-data"}}}}}};
    ASSERT_TRUE(hub_.Start(dir_.path(), config));
    hf_home_ = dir_.path() + "/host-hf-home";
    ::setenv("HF_ENDPOINT", hub_.url().c_str(), 1);  // the agent inherits these
    ::setenv("HF_HOME", hf_home_.c_str(), 1);
    ::unsetenv("HF_HUB_CACHE");
    ::unsetenv("HF_TOKEN");
    ::unsetenv("HF_TOKEN_PATH");
    agent_.set_stderr_file(dir_.path() + "/sftd-stderr.log");
    ASSERT_TRUE(agent_.Start());
  }
  void TearDown() override {
    for (const char* v : {"HF_ENDPOINT", "HF_HOME"}) ::unsetenv(v);
  }

  v1::Job Submit(const std::string& token) {
    nlohmann::json spec = StubSpec({});
    spec["model"] = {{"path", "hf://org/tiny"}};  // the stub lists the folder it becomes
    spec["data"] = {{"train", {"hf://datasets/org/data/train.jsonl"}}};
    v1::SubmitJobRequest req;
    req.set_spec_json(spec.dump());
    req.set_hf_token(token);
    v1::Job job;
    grpc::Status s = agent_.stub()->SubmitJob(agent_.Ctx().get(), req, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }

  TempDir dir_{"agent-hub"};
  FakeHub hub_;
  std::string hf_home_;
  Agent agent_{dir_.path() + "/agent"};
};

TEST_F(AgentHubTest, DownloadsModelAndDataBeforeTheTrainerAndKeepsTheTokenOutOfEveryFile) {
  v1::Job job = Submit(kToken);
  EXPECT_EQ(job.state(), v1::QUEUED);
  EXPECT_EQ(job.reason(),
            "downloading from the Hugging Face Hub: hf://org/tiny, hf://datasets/org/data/train.jsonl");
  v1::Job done = agent_.WaitState(job.id(), v1::SUCCEEDED);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();

  // The trainer's spec names the snapshots in the host's HF cache.
  const std::string models = hf_home_ + "/hub/models--org--tiny/snapshots";
  ASSERT_TRUE(fs::is_directory(models));
  const std::string snapshot = fs::directory_iterator(models)->path().string();
  const nlohmann::json spec = nlohmann::json::parse(ReadWholeFile(done.job_dir() + "/spec.json"));
  EXPECT_EQ(spec["model"]["path"], snapshot);
  EXPECT_EQ(ReadWholeFile(spec["data"]["train"][0].get<std::string>()), "{\"text\": \"hello\"}\n");
  EXPECT_EQ(ReadWholeFile(hf_home_ + "/hub/models--org--tiny/refs/main"),
            fs::path(snapshot).filename().string());

  // ... and the trainer read the downloaded model folder (the stub lists it), without other formats.
  std::vector<std::string> lines = StdoutByRank(agent_.Events(job.id(), 0, false))[0];
  std::vector<std::string> entries;
  for (const auto& l : lines)
    if (l.rfind("entry ", 0) == 0) entries.push_back(l);
  EXPECT_THAT(entries, ::testing::ElementsAre("entry config.json {\"model_type\": \"qwen2\"}",
                                              "entry model.safetensors safetensors bytes of a tiny model"));

  // The token went to the Hub (every Hub request) and nowhere else (the CDN's requests carry none).
  int hub_requests = 0;
  for (const auto& e : hub_.Log()) {
    if (e["port"] == "hub") {
      ++hub_requests;
      EXPECT_EQ(e["auth"], std::string("Bearer ") + kToken) << e.dump();
    } else {
      EXPECT_TRUE(e["auth"].is_null()) << e.dump();
    }
  }
  EXPECT_GT(hub_requests, 0);

  // Not in the database, the journal, the job's files, the agent's log.
  agent_.Stop();
  int files = 0;
  std::vector<std::string> roots = {agent_.data_dir(), dir_.path() + "/sftd-stderr.log"};
  for (const std::string& root : roots) {
    std::vector<fs::path> paths = {root};
    if (fs::is_directory(root))
      for (auto& e : fs::recursive_directory_iterator(root)) paths.push_back(e.path());
    for (const auto& p : paths) {
      if (!fs::is_regular_file(fs::symlink_status(p))) continue;
      ++files;
      EXPECT_EQ(ReadWholeFile(p.string()).find(kToken), std::string::npos) << "token written to " << p;
    }
  }
  EXPECT_GT(files, 5);  // state db, journal, spec.json, rank logs, the log
  EXPECT_THAT(ReadWholeFile(dir_.path() + "/sftd-stderr.log"),
              HasSubstr("downloading 2 path(s) from the Hugging Face Hub"));
}

TEST_F(AgentHubTest, GatedModelWithoutTokenFailsTheJobWithTheHubsMessage) {
  v1::Job job = Submit("");
  v1::Job failed = agent_.WaitState(job.id(), v1::FAILED);
  EXPECT_EQ(failed.reason(),
            "download: field 'model.path': hf://org/tiny: model org/tiny is gated and no token was sent: "
            "accept the "
            "licence at " +
                hub_.url() +
                "/org/tiny and submit again with `sftctl submit --forward-hf-token` (your token then goes to "
                "this host for this job's downloads, never stored), or put HF_TOKEN in the agent's "
                "~/.config/sftd/env");
  EXPECT_EQ(failed.ranks_size(), 0);  // the trainer never started
}

}  // namespace
}  // namespace sftctl::agent::testing
