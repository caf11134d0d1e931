// `sftctl run --local --upload-to hf://ORG/NAME` end to end through the real binaries against the
// fake Hub (tests/util/fake_hub.py): the run's checkpoints are committed to a private model repository
// (checkpoint.keep applied there), the final one downloads back equal to the local folder, the token
// is in no file of the run folder, and a read-only token fails before any training.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "common/hub/hf_hub.h"
#include "common/hub/hub_commit.h"
#include "tests/client/tiny_job.h"
#include "tests/util/command.h"
#include "tests/util/fake_hub.h"
#include "tests/util/file_util.h"
#include "tests/util/temp_dir.h"

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

  // sftctl with the fake Hub as HF_ENDPOINT, `token` as HF_TOKEN, and a Hugging Face home of its own.
  testing::CommandResult Sftctl(std::vector<std::string> args, const std::string& token) {
    args.insert(args.begin(), Bin("sftctl"));
    return RunCommand(args,
                      {"HF_ENDPOINT=" + hub_.url(), "HF_TOKEN=" + token, "HF_HOME=" + dir_.path() + "/hf"});
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

TEST_F(HubUploadTest, SubmitRefusesAHubTargetBeforeConnecting) {
  const std::string dir = dir_.path() + "/submit";
  const std::string spec = testing::WriteTinyJobSpec(dir, "checkpoint: {upload_to: \"hf://org/run\"}\n");
  auto r = Sftctl({"submit", "--host", "127.0.0.1:1", spec}, kWriteToken);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("checkpoint.upload_to: hf://org/run: uploads to the Hub are made by "
                                  "`sftctl run --local` only"));
  for (const auto& e : hub_.Log()) ADD_FAILURE() << "the Hub was asked: " << e.dump();
}

}  // namespace
}  // namespace sftctl
