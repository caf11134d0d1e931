// checkpoint.upload_to for a remote job: `sftctl submit --upload-to s3://... --forward-aws-credentials`
// to a real local agent (sftd, started without any AWS credentials of its own), which uploads the
// job's checkpoints to moto_server (strict SigV4) with the credentials it holds in memory only: the
// secret is in no file of the agent (database, journal, logs, spec) and in no output.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "common/object_store/checkpoint_store.h"
#include "common/object_store/s3_client.h"
#include "tests/client/tiny_job.h"
#include "tests/object_store/s3_server.h"
#include "tests/util/command.h"
#include "tests/util/file_util.h"
#include "tests/util/temp_dir.h"

namespace sftctl {
namespace {

using testing::Bin;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCommand;

TEST(AgentUploadTest, SubmittedJobUploadsWithForwardedCredentialsKeptInMemory) {
  testing::S3Server server;
  ASSERT_EQ(server.Start(/*strict=*/true), "") << "deploy/install-deps.sh installs moto";
  S3Client s3(S3Endpoint{server.endpoint(), ""},
              AwsCredentials{server.access_key(), server.secret_key(), "", "t"});
  ASSERT_TRUE(s3.CreateBucket("remote").ok());
  testing::TempDir dir("s3agent");
  const std::string agent = dir.path() + "/agent", home = dir.path() + "/home";
  std::filesystem::create_directories(home);
  // The agent has no AWS credentials of its own.
  auto started =
      RunCommand({"env", "-u", "AWS_ACCESS_KEY_ID", "-u", "AWS_SECRET_ACCESS_KEY", "-u", "AWS_PROFILE", "-u",
                  "AWS_SESSION_TOKEN", "HOME=" + home, "AWS_SHARED_CREDENTIALS_FILE=/dev/null", Bin("sftd"),
                  "start", "--detach", "--data-dir", agent, "--gpus", "none"});
  ASSERT_EQ(started.exit_code, 0) << started.output;
  struct StopAgent {
    std::string dir;
    ~StopAgent() { RunCommand({Bin("sftd"), "stop", "--data-dir", dir}); }
  } stop{agent};

  const std::string spec = testing::WriteTinyJobSpec(
      dir.path(), "train: {max_steps: 4, batch_size: 4}\ncheckpoint: {interval: 2, keep: 1, endpoint_url: " +
                      server.endpoint() + "}\n");
  std::vector<std::string> env = server.ClientEnv();
  env.push_back("HOME=" + home);
  env.push_back("XDG_CONFIG_HOME=" + home + "/config");
  auto r = RunCommand({Bin("sftctl"), "submit", "--host", "local:" + agent, spec, "--cpu-ranks", "1",
                       "--upload-to", "s3://remote/job", "--forward-aws-credentials", "--json"},
                      env);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("sending your AWS credentials"));
  const std::string job = nlohmann::json::parse(r.output.substr(r.output.find('{')))["job"];
  r = RunCommand({Bin("sftctl"), "logs", "-f", job}, env);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The agent finishes the last upload after the job ended: wait for its manifest (bounded).
  std::optional<CheckpointManifest> newest;
  for (int i = 0; i < 600 && !(newest && newest->step == 4); ++i) {
    auto got = NewestBucketCheckpoint(s3, S3Location{"remote", "job"});
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    newest = *got;
    if (!(newest && newest->step == 4)) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->step, 4);
  const std::string run = agent + "/jobs/" + job + "/run";
  for (const auto& f : newest->files)
    EXPECT_EQ(*s3.GetObject("remote", "job/checkpoint-000004/" + f.path, 1ull << 30),
              testing::ReadWholeFile(run + "/checkpoint-000004/" + f.path))
        << f.path;
  // The secret reached no file of the agent and no output.
  auto grep = RunCommand({"grep", "-rlaF", server.secret_key(), agent, home});
  EXPECT_EQ(grep.exit_code, 1) << grep.output;  // 1: no match
  EXPECT_THAT(r.output, Not(HasSubstr(server.secret_key())));
}

}  // namespace
}  // namespace sftctl
