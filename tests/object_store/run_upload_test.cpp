// `sftctl run --local --upload-to s3://...`, `pull s3://...` and `--resume-from s3://...` end to end
// through the real binaries against moto_server (strict SigV4): every checkpoint reaches the bucket
// with its manifest, awscli sees the same files, a run resumed from the bucket ends bit-identical to
// the uninterrupted one, bad credentials and buckets fail before training, and the secret is written
// nowhere; uploads the server refuses are reported and do not hold up training.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "common/object_store/checkpoint_store.h"
#include "common/object_store/s3_client.h"
#include "tests/client/tiny_job.h"
#include "tests/object_store/s3_server.h"
#include "tests/util/command.h"
#include "tests/util/file_util.h"
#include "tests/util/temp_dir.h"

namespace sftctl {
namespace {

namespace fs = std::filesystem;
using testing::Bin;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCommand;

class RunUploadTest : public testing::S3SuiteTest<RunUploadTest> {
 protected:
  void SetUp() override {
    S3SuiteTest::SetUp();
    if (HasFatalFailure()) return;
    s3_ = NewClient("");
  }
  // The client's environment: the server's key, its endpoint, no config file of this machine.
  std::vector<std::string> Env() {
    auto env = server_->ClientEnv();
    env.push_back("AWS_ENDPOINT_URL=" + server_->endpoint());
    return env;
  }
  testing::CommandResult Sftctl(std::vector<std::string> args, std::vector<std::string> env = {}) {
    args.insert(args.begin(), Bin("sftctl"));
    if (env.empty()) env = Env();
    return RunCommand(args, env);
  }
  std::vector<double> Losses(const std::string& metrics) {
    std::vector<double> out;
    for (const auto& rec : testing::ReadMetrics(metrics))
      if (rec["event"] == "step") out.push_back(rec["loss"].get<double>());
    return out;
  }

  std::unique_ptr<S3Client> s3_;
};

TEST_F(RunUploadTest, UploadsEveryCheckpointAndResumesBitExactlyFromTheBucket) {
  ASSERT_TRUE(s3_->CreateBucket("runs").ok());
  testing::TempDir dir("s3e2e");
  const std::string spec = testing::WriteTinyJobSpec(
      dir.path(), "train: {max_steps: 8, batch_size: 4}\ncheckpoint: {interval: 4, keep: 2}\n");
  // The uninterrupted run, uploading as it trains.
  const std::string a = dir.path() + "/a";
  auto r = Sftctl({"run", "--local", spec, "-o", a, "--upload-to", "s3://runs/exp1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("sftctl: upload: uploaded checkpoint-000008 to s3://runs/exp1"));
  auto newest = NewestBucketCheckpoint(*s3_, S3Location{"runs", "exp1"});
  ASSERT_TRUE(newest.ok() && newest->has_value()) << newest.status().ToString();
  EXPECT_EQ((*newest)->step, 8);
  EXPECT_EQ(*s3_->GetObject("runs", "exp1/metrics.jsonl"), testing::ReadWholeFile(a + "/metrics.jsonl"));
  // awscli lists the checkpoint's files with their local sizes.
  auto ls = RunCommand({"/usr/bin/aws", "--endpoint-url", server_->endpoint(), "s3", "ls", "--recursive",
                        "s3://runs/exp1/checkpoint-000008/"},
                       server_->ClientEnv());
  ASSERT_EQ(ls.exit_code, 0) << ls.output;
  for (const auto& f : fs::directory_iterator(a + "/checkpoint-000008"))
    EXPECT_THAT(ls.output, HasSubstr(std::to_string(fs::file_size(f.path())) + " exp1/checkpoint-000008/" +
                                     f.path().filename().string()));
  EXPECT_THAT(ls.output, HasSubstr("exp1/checkpoint-000008/MANIFEST.json"));

  // The host "died" before step 8's upload completed: only checkpoint-4 is complete in the bucket.
  ASSERT_TRUE(s3_->DeleteObject("runs", "exp1/checkpoint-000008/MANIFEST.json").ok());
  const std::string b = dir.path() + "/b";
  r = Sftctl({"run", "--local", spec, "-o", b, "--resume-from", "s3://runs/exp1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("downloading s3://runs/exp1/checkpoint-000004"));
  const std::vector<double> full = Losses(a + "/metrics.jsonl"), resumed = Losses(b + "/metrics.jsonl");
  ASSERT_EQ(full.size(), 8u);
  ASSERT_EQ(resumed.size(), 4u);  // steps 5..8
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed[i], full[4 + i]) << "step " << 5 + i;
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(testing::ReadWholeFile(b + "/checkpoint-000008/" + f),
              testing::ReadWholeFile(a + "/checkpoint-000008/" + f))
        << f;

  // pull: the newest complete checkpoint, verified, next to the run's metrics.
  const std::string pulled = dir.path() + "/pulled";
  r = Sftctl({"pull", "s3://runs/exp1", pulled});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& f : fs::directory_iterator(a + "/checkpoint-000004"))
    EXPECT_EQ(testing::ReadWholeFile(pulled + "/checkpoint-000004/" + f.path().filename().string()),
              testing::ReadWholeFile(f.path().string()))
        << f.path();
  EXPECT_TRUE(fs::exists(pulled + "/metrics.jsonl"));

  // A stranger in the bucket (issue 37, item 3): a copy of checkpoint-4 planted as checkpoint-000099,
  // its state and manifest consistent, but not signed with this machine's key for the prefix
  // (client/transfer/checkpoint_key.h). A resume passes over it and takes checkpoint-4 again.
  const std::string planted = dir.path() + "/planted/checkpoint-000099";
  fs::create_directories(fs::path(planted).parent_path());
  fs::copy(a + "/checkpoint-000004", planted, fs::copy_options::recursive);
  nlohmann::json state = nlohmann::json::parse(testing::ReadWholeFile(planted + "/trainer_state.json"));
  state["step"] = 99;
  testing::WriteWholeFile(planted + "/trainer_state.json", state.dump(2));
  ASSERT_TRUE(UploadCheckpoint(*s3_, S3Location{"runs", "exp1"}, planted, TransferOptions()).ok());
  const std::string c = dir.path() + "/c";
  r = Sftctl({"run", "--local", spec, "-o", c, "--resume-from", "s3://runs/exp1", "--max-steps", "5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("downloading s3://runs/exp1/checkpoint-000004"));
  EXPECT_FALSE(fs::exists(c + "/checkpoint-000099"));

  // The secret is in no file of the runs and in no output.
  auto grep = RunCommand({"grep", "-rlF", server_->secret_key(), a, b, pulled});
  EXPECT_EQ(grep.exit_code, 1) << grep.output;  // 1: no match
  EXPECT_THAT(r.output, Not(HasSubstr(server_->secret_key())));
}

TEST_F(RunUploadTest, BadCredentialsOrBucketFailBeforeTraining) {
  ASSERT_TRUE(s3_->CreateBucket("there").ok());
  testing::TempDir dir("s3bad");
  const std::string spec = testing::WriteTinyJobSpec(dir.path(), "train: {max_steps: 2, batch_size: 4}\n");
  auto env = Env();
  env.insert(env.begin(), "AWS_SECRET_ACCESS_KEY=not-the-secret-123");
  auto r = Sftctl({"run", "--local", spec, "-o", dir.path() + "/w", "--upload-to", "s3://there/x"}, env);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("checkpoint.upload_to: s3://there"));
  EXPECT_THAT(r.output, HasSubstr("SignatureDoesNotMatch"));
  EXPECT_THAT(r.output, Not(HasSubstr("not-the-secret-123")));
  EXPECT_FALSE(fs::exists(dir.path() + "/w/metrics.jsonl"));
  EXPECT_FALSE(fs::exists(dir.path() + "/w/spec.json"));  // nothing written before the check
  r = Sftctl({"run", "--local", spec, "-o", dir.path() + "/m", "--upload-to", "s3://missing-bucket/x"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("NoSuchBucket"));
  EXPECT_FALSE(fs::exists(dir.path() + "/m/metrics.jsonl"));
  r = Sftctl({"run", "--local", spec, "-o", dir.path() + "/e", "--resume-from", "s3://there/empty"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("s3://there/empty has no complete checkpoint"));
  r = Sftctl({"run", "--local", spec, "-o", dir.path() + "/u", "--upload-to", "gs://x/y"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("field 'checkpoint.upload_to': must be s3://BUCKET[/PREFIX]"));
  const std::string bad_endpoint = testing::WriteTinyJobSpec(
      dir.path() + "/ep",
      "train: {max_steps: 2}\ncheckpoint: {upload_to: s3://there/x, endpoint_url: ftp://h}\n");
  r = Sftctl({"run", "--local", bad_endpoint});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("job.yaml:"));
  EXPECT_THAT(r.output, HasSubstr("field 'checkpoint.endpoint_url': must be an http:// or https:// URL"));
  r = Sftctl({"pull", "s3://there/empty", dir.path() + "/p"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("s3://there/empty has no complete checkpoint"));
}

// A server that refuses every upload (an S3 policy's Deny on PutObject, the way a full quota or a
// read-only key refuses): listing passes, so the run starts; each upload fails with S3's error, which
// names the object and the request; training goes on to its last step; the run exits non-zero because
// its final checkpoint is not in the bucket.
TEST_F(RunUploadTest, RefusedUploadsAreClearAndDoNotBlockTraining) {
  ASSERT_TRUE(s3_->CreateBucket("full").ok());
  testing::TempDir dir("s3refused");
  const std::string spec = testing::WriteTinyJobSpec(
      dir.path(), "train: {max_steps: 6, batch_size: 4}\ncheckpoint: {interval: 2, keep: 2}\n");
  auto env = Env();
  env.insert(env.begin(), {"AWS_ACCESS_KEY_ID=" + server_->refused_access_key(),
                           "AWS_SECRET_ACCESS_KEY=" + server_->refused_secret_key()});
  const std::string w = dir.path() + "/w";
  auto r = Sftctl({"run", "--local", spec, "-o", w, "--upload-to", "s3://full/run"}, env);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("sftctl: upload: upload of checkpoint-000006 failed: "));
  EXPECT_THAT(r.output, HasSubstr("full/run/checkpoint-000006/"));
  EXPECT_THAT(r.output, HasSubstr("HTTP 403 AccessDenied"));
  EXPECT_THAT(r.output, Not(HasSubstr(server_->refused_secret_key())));
  // Training was not held up: every step ran and the last checkpoint is complete here.
  int steps = 0;
  for (const auto& rec : testing::ReadMetrics(w + "/metrics.jsonl")) steps += rec["event"] == "step";
  EXPECT_EQ(steps, 6);
  EXPECT_TRUE(fs::exists(w + "/checkpoint-000006/DONE"));
  // Nothing a reader would take reached the bucket.
  auto newest = NewestBucketCheckpoint(*s3_, S3Location{"full", "run"});
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  EXPECT_FALSE(newest->has_value());
}

}  // namespace
}  // namespace sftctl
