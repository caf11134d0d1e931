// `sftctl run --local --upload-to hf://ORG/NAME` end to end through the real binaries against the
// fake Hub (tests/util/fake_hub.py): the run's checkpoints are committed to a private model repository
// (checkpoint.keep applied there), the final one downloads back equal to the local folder, the token
// is in no file of the run folder, and a read-only token fails before any training; with
// `checkpoint.upload: final` only the last checkpoint's model goes up, at the repository's root. And
// `submit --upload-to hf://...`: a real local agent commits the job's checkpoints with the forwarded
// token, which it keeps in memory only.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "common/hub/hf_hub.h"
#include "common/hub/hub_commit.h"
#include "tests/client/tiny_job.h"
#include "tests/util/command.h"
#include "tests/util/fake_hub.h"
#include "tests/util/file_util.h"
#include "tests/util/temp_dir.h"
#include "tests/util/wait_for.h"

namespace sftctl {
namespace {

namespace fs = std::filesystem;
using testing::Bin;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCommand;

constexpr const char* kReadToken = "hf_read_only_token_for_e2e";
constexpr const char* kWriteToken = "hf_write_token_for_e2e_secret";

class HubUploadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(hub_.Start(
        dir_.path(),
        {{"token", kReadToken}, {"write_token", kWriteToken}, {"repos", nlohmann::json::object()}}));
    spec_ = testing::WriteTinyJobSpec(
        dir_.path(), "train: {max_steps: 8, batch_size: 4}\ncheckpoint: {interval: 4, keep: 1}\n");
  }

  // sftctl with the fake Hub as HF_ENDPOINT, `token` as HF_TOKEN, and a Hugging Face home and a home
  // (its job registry) of its own.
  testing::CommandResult Sftctl(std::vector<std::string> args, const std::string& token) {
    args.insert(args.begin(), Bin("sftctl"));
    return RunCommand(args,
                      {"HF_ENDPOINT=" + hub_.url(), "HF_TOKEN=" + token, "HF_HOME=" + dir_.path() + "/hf",
                       "HOME=" + dir_.path() + "/home", "XDG_CONFIG_HOME=" + dir_.path() + "/home/config"});
  }

  HubOptions Options(const std::string& token) {
    HubOptions o;
    o.endpoint = hub_.url();
    o.cache_dir = dir_.path() + "/cache";
    o.token = token;
    return o;
  }

  testing::TempDir dir_{"hubup"};
  testing::FakeHub hub_;
  std::string spec_;
};

TEST_F(HubUploadTest, RunLocalCommitsItsCheckpointsToTheHub) {
  const std::string run = dir_.path() + "/run";
  auto r = Sftctl({"run", "--local", spec_, "-o", run, "--upload-to", "hf://org/run"}, kWriteToken);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("sftctl: upload: uploaded checkpoint-000008 to hf://org/run"));
  EXPECT_THAT(r.output, Not(HasSubstr(kWriteToken)));

  auto listed = HubCommitter(Options(kWriteToken)).ListFiles("org/run", "main");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_THAT(*listed, Contains("metrics.jsonl"));
  EXPECT_THAT(*listed, Contains("spec.json"));
  for (const std::string& f : *listed)  // keep: 1 holds in the repository too
    EXPECT_THAT(f, Not(HasSubstr("checkpoint-000004"))) << f;

  // The final checkpoint comes back equal, file for file (the repository is private: the read token).
  auto ref = ParseHubRef("hf://org/run/checkpoint-000008");
  ASSERT_TRUE(ref.ok());
  auto snap = HubDownloader(Options(kReadToken)).Download(*ref, {"checkpoint-000008/*"});
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  int files = 0;
  for (const auto& f : fs::directory_iterator(run + "/checkpoint-000008")) {
    ++files;
    EXPECT_EQ(testing::ReadWholeFile(snap->folder + "/checkpoint-000008/" + f.path().filename().string()),
              testing::ReadWholeFile(f.path().string()))
        << f.path();
  }
  EXPECT_GE(files, 3);
  EXPECT_FALSE(HubDownloader(Options("")).Download(*ref, {"checkpoint-000008/*"}).ok());

  // The token is in no file of the run folder (nor of the Hugging Face home the client used).
  auto grep = RunCommand({"grep", "-rlF", kWriteToken, run});
  EXPECT_EQ(grep.exit_code, 1) << grep.output;                       // 1: no match
  EXPECT_FALSE(fs::exists(run + "/.hub-upload/checkpoint-000008"));  // uploaded: the staging is gone
}

TEST_F(HubUploadTest, ReadOnlyTokenFailsBeforeTraining) {
  const std::string run = dir_.path() + "/ro";
  auto r = Sftctl({"run", "--local", spec_, "-o", run, "--upload-to", "hf://org/run"}, kReadToken);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("checkpoint.upload_to"));
  EXPECT_THAT(r.output, HasSubstr("hf://org/run"));
  EXPECT_THAT(r.output, HasSubstr("write access"));
  EXPECT_FALSE(fs::exists(run + "/metrics.jsonl"));  // nothing trained
  r = Sftctl({"run", "--local", spec_, "-o", run, "--upload-to", "hf://datasets/org/run"}, kWriteToken);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("hf://ORG/NAME"));
}

TEST_F(HubUploadTest, FinalOnlyPutsTheLastCheckpointsModelAtTheRoot) {
  const std::string run = dir_.path() + "/final";
  auto r = Sftctl({"run", "--local", spec_, "-o", run, "--upload-to", "hf://org/final", "--set",
                   "checkpoint.upload=final"},
                  kWriteToken);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("sftctl: upload: uploaded checkpoint-000008 to hf://org/final"));
  EXPECT_THAT(r.output, Not(HasSubstr("checkpoint-000004 to")));  // only the last one goes up

  auto listed = HubCommitter(Options(kWriteToken)).ListFiles("org/final", "main");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_THAT(*listed, Contains("model.safetensors"));
  EXPECT_THAT(*listed, Contains("config.json"));
  EXPECT_THAT(*listed, Contains("metrics.jsonl"));
  for (const std::string& f : *listed) {  // no folder, and nothing only resuming needs
    EXPECT_THAT(f, Not(HasSubstr("checkpoint-"))) << f;
    EXPECT_NE(f, "optimizer.safetensors");
    EXPECT_NE(f, "trainer_state.json");
  }
  auto ref = ParseHubRef("hf://org/final");
  ASSERT_TRUE(ref.ok());
  auto snap = HubDownloader(Options(kReadToken)).Download(*ref);
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  for (const char* f : {"model.safetensors", "config.json"})
    EXPECT_EQ(testing::ReadWholeFile(snap->folder + "/" + f),
              testing::ReadWholeFile(run + "/checkpoint-000008/" + f))
        << f;
}

TEST_F(HubUploadTest, SubmitChecksTheForwardedTokenBeforeConnecting) {
  const std::string dir = dir_.path() + "/submit";
  const std::string spec = testing::WriteTinyJobSpec(dir, "checkpoint: {upload_to: \"hf://org/run\"}\n");
  auto r = Sftctl({"submit", "--host", "127.0.0.1:1", spec, "--forward-hf-token"}, kReadToken);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("checkpoint.upload_to"));
  EXPECT_THAT(r.output, HasSubstr("write access to org/run"));
  EXPECT_THAT(r.output, Not(HasSubstr("127.0.0.1:1")));  // it never tried the host
  r = Sftctl({"submit", "--host", "127.0.0.1:1", spec, "--upload-to", "hf://datasets/org/x"}, kWriteToken);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--upload-to"));
  EXPECT_THAT(r.output, HasSubstr("hf://ORG/NAME"));
}

#ifdef SFTCTL_TEST_AGENT
// A job on a real local agent (sftd, with no Hub token of its own) commits its checkpoints with the
// token the client forwarded, kept in memory: it is in no file of the agent. Without a forwarded
// token the job still trains and its output (`sftctl logs`) says how to give it one.
TEST_F(HubUploadTest, AgentCommitsASubmittedJobsCheckpointsWithTheForwardedToken) {
  const std::string agent = dir_.path() + "/agent", home = dir_.path() + "/agent-home";
  fs::create_directories(home);
  auto started = RunCommand({"env", "-u", "HF_TOKEN", "-u", "HF_TOKEN_PATH", "HOME=" + home,
                             "HF_HOME=" + home + "/hf", "HF_ENDPOINT=" + hub_.url(), Bin("sftd"), "start",
                             "--detach", "--data-dir", agent, "--gpus", "none"});
  ASSERT_EQ(started.exit_code, 0) << started.output;
  struct StopAgent {
    std::string dir;
    ~StopAgent() { RunCommand({Bin("sftd"), "stop", "--data-dir", dir}); }
  } stop{agent};
  std::string logs;  // of the latest job
  auto submit = [&](const std::string& repo, bool forward) {
    std::vector<std::string> args = {"submit", "--host",      "local:" + agent, spec_,   "--cpu-ranks",
                                     "1",      "--upload-to", "hf://" + repo,   "--json"};
    if (forward) args.push_back("--forward-hf-token");
    auto r = Sftctl(args, kWriteToken);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    if (r.exit_code != 0) return std::string();
    EXPECT_THAT(r.output, Not(HasSubstr(kWriteToken)));
    const std::string job = nlohmann::json::parse(r.output.substr(r.output.find('{')))["job"];
    r = Sftctl({"logs", "-f", job}, kWriteToken);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    logs = r.output;
    return job;
  };

  const std::string first = submit("org/remote", /*forward=*/true);
  ASSERT_NE(first, "");
  // The agent commits the last checkpoint after the job ended: wait for it (bounded).
  HubCommitter hub(Options(kWriteToken));
  std::vector<std::string> listed;
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        auto got = hub.ListFiles("org/remote", "main");
        if (got.ok()) listed = *got;
        return std::find(listed.begin(), listed.end(), "checkpoint-000008/DONE") != listed.end();
      },
      std::chrono::seconds(60), std::chrono::milliseconds(100)));
  EXPECT_THAT(listed, Contains("checkpoint-000008/model.safetensors"));
  EXPECT_THAT(listed, Contains("metrics.jsonl"));
  for (const std::string& f : listed) EXPECT_THAT(f, Not(HasSubstr("checkpoint-000004"))) << f;  // keep: 1

  // Without --forward-hf-token: trained, nothing committed, and the job's output says why.
  ASSERT_NE(submit("org/unforwarded", /*forward=*/false), "");
  EXPECT_THAT(logs, HasSubstr("sftd: checkpoint.upload_to: hf://org/unforwarded: uploading needs a Hub token "
                              "with write access to org/unforwarded: submit again with `sftctl submit "
                              "--forward-hf-token`"));
  EXPECT_THAT(logs, HasSubstr("SUCCEEDED"));
  EXPECT_THAT(testing::ReadWholeFile(agent + "/sftd.log"),
              HasSubstr("hf://org/unforwarded: uploading needs"));
  EXPECT_FALSE(hub.ListFiles("org/unforwarded", "main").ok());

  auto grep = RunCommand({"grep", "-rlaF", kWriteToken, agent, home});
  EXPECT_EQ(grep.exit_code, 1) << grep.output;  // 1: no match

  // The host goes away: `status` names the repository's newest checkpoint, read with this token.
  RunCommand({Bin("sftd"), "stop", "--data-dir", agent});
  fs::rename(agent, agent + ".lost");
  testing::WriteWholeFile(agent, "gone\n");
  auto st = Sftctl({"status", first}, kReadToken);
  EXPECT_EQ(st.exit_code, 4) << st.output;  // cannot reach
  EXPECT_THAT(st.output,
              HasSubstr("newest complete checkpoint in hf://org/remote: checkpoint-000008 (step 8)"));
  EXPECT_THAT(st.output,
              HasSubstr("sftctl download org/remote/checkpoint-000008 --include 'checkpoint-000008/*'"));
  st = Sftctl({"status", first}, "");
  EXPECT_THAT(st.output, HasSubstr("its checkpoints go to hf://org/remote, which cannot be read from here"));
}
#endif  // SFTCTL_TEST_AGENT

}  // namespace
}  // namespace sftctl
