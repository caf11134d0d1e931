// checkpoint.upload_to for a remote job: `sftctl submit --upload-to s3://... --forward-aws-credentials`
// to a real local agent (sftd, started without any AWS credentials of its own), which uploads the
// job's checkpoints to moto_server (strict SigV4) with the credentials it holds in memory only: the
// secret is in no file of the agent (database, journal, logs, spec) and in no output.
//
// And a host that goes away: a job uploading to the bucket is killed with its agent (SIGKILL, ranks
// too) after a checkpoint reached the bucket; a second agent with a fresh data folder gets `submit
// --resume-from s3://...` of the same spec, downloads that checkpoint before launch and ends with
// weights and optimizer state equal, bit for bit, to an uninterrupted run of the spec on that agent.
// Resuming from an empty prefix or a missing bucket fails the job (or the submit, checked up front
// with forwarded credentials) with a clear error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>

#include "common/object_store/checkpoint_store.h"
#include "common/object_store/s3_client.h"
#include "tests/client/tiny_job.h"
#include "tests/object_store/s3_server.h"
#include "tests/util/command.h"
#include "tests/util/file_util.h"
#include "tests/util/temp_dir.h"
#include "tests/util/wait_for.h"

namespace sftctl {
namespace {

using testing::Bin;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCommand;
using testing::RunForStdout;

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
  Status listing;
  testing::WaitFor(
      [&] {
        auto got = NewestBucketCheckpoint(s3, S3Location{"remote", "job"});
        listing = got.status();
        if (got.ok()) newest = *got;
        return !got.ok() || (newest && newest->step == 4);
      },
      std::chrono::seconds(60), std::chrono::milliseconds(100));
  ASSERT_TRUE(listing.ok()) << listing.ToString();
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

// An agent started detached in `dir` (its own data folder and HOME), stopped at the end unless
// killed; `env`: its environment entries (AWS credentials or none).
class DetachedAgent {
 public:
  DetachedAgent(std::string dir, std::vector<std::string> env) : dir_(std::move(dir)), env_(std::move(env)) {}
  ~DetachedAgent() {
    if (!killed_) RunCommand({Bin("sftd"), "stop", "--data-dir", dir_ + "/data"});
  }
  ::testing::AssertionResult Start() {
    std::filesystem::create_directories(dir_ + "/home");
    std::vector<std::string> argv = {"env"};  // -u NAME options first, then NAME=VALUE
    argv.insert(argv.end(), env_.begin(), env_.end());
    argv.push_back("HOME=" + dir_ + "/home");
    argv.insert(argv.end(),
                {Bin("sftd"), "start", "--detach", "--data-dir", dir_ + "/data", "--gpus", "none"});
    auto r = RunCommand(argv);
    if (r.exit_code != 0) return ::testing::AssertionFailure() << r.output;
    return ::testing::AssertionSuccess();
  }
  // The host name for sftctl.
  std::string host() const { return "local:" + dir_ + "/data"; }
  std::string RunDir(const std::string& job) const { return dir_ + "/data/jobs/" + job + "/run"; }
  // SIGKILL, as a host that went away (its ranks are killed by the caller).
  void Kill() {
    auto st = RunForStdout({Bin("sftd"), "status", "--json", "--data-dir", dir_ + "/data"});
    auto j = nlohmann::json::parse(st.output, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.value("running", false)) << st.output;
    ASSERT_EQ(::kill(j["pid"].get<pid_t>(), SIGKILL), 0);
    killed_ = true;
  }
  // The host is gone for good: its data folder becomes a file, where no agent can start.
  void MakeUnreachable() {
    std::filesystem::rename(dir_ + "/data", dir_ + "/data.lost");
    testing::WriteWholeFile(dir_ + "/data", "gone\n");
  }

 private:
  std::string dir_;
  std::vector<std::string> env_;
  bool killed_ = false;
};

class AgentResumeTest : public testing::S3SuiteTest<AgentResumeTest> {
 protected:
  void SetUp() override {
    S3SuiteTest::SetUp();
    if (HasFatalFailure()) return;
    s3_ = NewClient("");
    home_ = dir_.path() + "/client";
    std::filesystem::create_directories(home_);
  }
  // sftctl with the user's credentials and its own job registry.
  testing::CommandResult Sftctl(std::vector<std::string> args) {
    args.insert(args.begin(), Bin("sftctl"));
    std::vector<std::string> env = server_->ClientEnv();
    env.push_back("HOME=" + home_);
    env.push_back("XDG_CONFIG_HOME=" + home_ + "/config");
    return RunCommand(args, env);
  }
  // Submits `spec` to `agent` with `extra` flags; returns the job id ("" after a failure).
  std::string Submit(const DetachedAgent& agent, const std::string& spec, std::vector<std::string> extra) {
    std::vector<std::string> args = {"submit", "--host", agent.host(), spec, "--cpu-ranks", "1", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = Sftctl(args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    if (r.exit_code != 0 || r.output.find('{') == std::string::npos) return "";
    return nlohmann::json::parse(r.output.substr(r.output.find('{')))["job"];
  }
  // `sftctl status --json` of agent/job.
  nlohmann::json JobStatus(const DetachedAgent& agent, const std::string& job) {
    auto r = Sftctl({"status", agent.host() + "/" + job, "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    auto j =
        nlohmann::json::parse(r.output.substr(std::min(r.output.find('{'), r.output.size())), nullptr, false);
    return j.is_object() ? j : nlohmann::json::object();
  }

  testing::TempDir dir_{"s3resume"};
  std::string home_;
  std::unique_ptr<S3Client> s3_;
};

TEST_F(AgentResumeTest, AJobWhoseHostWentAwayFinishesOnAnotherAgentBitExactly) {
  ASSERT_TRUE(s3_->CreateBucket("lost").ok());
  // Checkpoints every 10 steps; the first agent is stopped at the first. 30 steps more take seconds
  // (each step of the tiny job takes tens of ms), far longer than noticing the checkpoint does.
  constexpr int kSteps = 40;
  const std::string spec = testing::WriteTinyJobSpec(
      dir_.path(), "train: {max_steps: " + std::to_string(kSteps) +
                       ", batch_size: 4}\ncheckpoint: {interval: 10, keep: 1, endpoint_url: " +
                       server_->endpoint() + "}\n");
  // The first host: an agent without credentials of its own, uploading with the user's.
  DetachedAgent a(dir_.path() + "/a",
                  {"-u", "AWS_ACCESS_KEY_ID", "-u", "AWS_SECRET_ACCESS_KEY", "-u", "AWS_PROFILE", "-u",
                   "AWS_SESSION_TOKEN", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"});
  ASSERT_TRUE(a.Start());
  const std::string lost = Submit(a, spec, {"--upload-to", "s3://lost/run", "--forward-aws-credentials"});
  ASSERT_NE(lost, "");
  pid_t pgid = 0;  // the rank's process group
  testing::WaitFor(
      [&] {
        nlohmann::json st = JobStatus(a, lost);
        if (st.contains("nodes") && !st["nodes"][0]["ranks"].empty())
          pgid = st["nodes"][0]["ranks"][0]["pid"];
        return pgid != 0;
      },
      std::chrono::seconds(60), std::chrono::milliseconds(100));
  ASSERT_GT(pgid, 0) << "the job never ran";
  // Freeze the rank as soon as its first checkpoint is complete, let the agent upload it, then kill
  // the agent and the rank: the host is gone, mid-run.
  const std::string first = a.RunDir(lost) + "/checkpoint-000010/DONE";
  testing::WaitFor([&] { return std::filesystem::exists(first); }, std::chrono::seconds(60),
                   std::chrono::milliseconds(1));
  ASSERT_EQ(::kill(-pgid, SIGSTOP), 0);
  ASSERT_TRUE(std::filesystem::exists(first)) << "no first checkpoint";
  std::optional<CheckpointManifest> uploaded;
  Status listing;
  testing::WaitFor(
      [&] {
        auto got = NewestBucketCheckpoint(*s3_, S3Location{"lost", "run"});
        listing = got.status();
        if (got.ok()) uploaded = *got;
        return !got.ok() || uploaded.has_value();
      },
      std::chrono::seconds(60), std::chrono::milliseconds(100));
  a.Kill();
  ::kill(-pgid, SIGKILL);
  ASSERT_TRUE(listing.ok()) << listing.ToString();
  ASSERT_TRUE(uploaded.has_value()) << "the first agent uploaded no checkpoint";
  ASSERT_GE(uploaded->step, 10);
  ASSERT_LT(uploaded->step, kSteps) << "the job ended before it was stopped";
  char name[32];
  std::snprintf(name, sizeof(name), "checkpoint-%06lld", static_cast<long long>(uploaded->step));
  const std::string in_bucket = name;

  // `status` of the lost job: its host does not answer (its agent's data folder is gone, so no agent
  // can start there again); the bucket's newest checkpoint is named, read with the user's credentials.
  a.MakeUnreachable();
  auto r = Sftctl({"status", lost});
  EXPECT_EQ(r.exit_code, 4) << r.output;  // cannot reach
  EXPECT_THAT(r.output, HasSubstr("the host does not answer"));
  EXPECT_THAT(r.output, HasSubstr("newest complete checkpoint in the bucket: s3://lost/run/" + in_bucket));
  EXPECT_THAT(r.output, HasSubstr("sftctl resubmit " + a.host() + "/" + lost + " --host OTHER"));
  // Without credentials here it says how to look.
  r = RunCommand({"env", "-u", "AWS_ACCESS_KEY_ID", "-u", "AWS_SECRET_ACCESS_KEY", "-u", "AWS_PROFILE",
                  "AWS_SHARED_CREDENTIALS_FILE=/dev/null", "HOME=" + home_,
                  "XDG_CONFIG_HOME=" + home_ + "/config", Bin("sftctl"), "status", lost});
  EXPECT_THAT(r.output, HasSubstr("the host does not answer"));
  EXPECT_THAT(r.output, HasSubstr("its checkpoints go to s3://lost/run, which cannot be read from here"));
  EXPECT_THAT(r.output, HasSubstr("aws s3 ls s3://lost/run/"));

  // The second host: a fresh agent with credentials of its own. First the uninterrupted run.
  DetachedAgent b(dir_.path() + "/b", server_->ClientEnv());
  ASSERT_TRUE(b.Start());
  const std::string whole = Submit(b, spec, {});
  ASSERT_NE(whole, "");
  r = Sftctl({"logs", "-f", b.host() + "/" + whole});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Then the lost job, from the bucket, still uploading there: `resubmit` takes its spec and submit
  // options (--cpu-ranks 1, --upload-to) from the registry.
  r = Sftctl({"resubmit", a.host() + "/" + lost, "--host", b.host(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("resubmit: " + a.host() + "/" + lost + " continues from s3://lost/run"));
  const std::string resumed = nlohmann::json::parse(r.output.substr(r.output.find('{')))["job"];
  ASSERT_NE(resumed, "");
  r = Sftctl({"logs", "-f", b.host() + "/" + resumed});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("downloaded s3://lost/run/" + in_bucket + " to resume from"));
  std::snprintf(name, sizeof(name), "checkpoint-%06d", kSteps);
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    const std::string want = testing::ReadWholeFile(b.RunDir(whole) + "/" + name + "/" + f);
    ASSERT_FALSE(want.empty()) << f;
    EXPECT_TRUE(testing::ReadWholeFile(b.RunDir(resumed) + "/" + name + "/" + f) == want) << f << " differs";
  }
  // A job whose checkpoints stayed on its host cannot be continued elsewhere; a host must be named.
  r = Sftctl({"resubmit", b.host() + "/" + whole, "--host", a.host()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("its checkpoints did not go to a bucket"));
  r = Sftctl({"resubmit", a.host() + "/" + lost});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("name the host to continue on with --host"));
  // A spec edited since the submit is refused (it could train other data or another model on the
  // run's checkpoint) unless asked for; nothing reaches a host.
  testing::WriteWholeFile(spec, testing::ReadWholeFile(spec) + "# edited\n");
  r = Sftctl({"resubmit", a.host() + "/" + lost, "--host", b.host()});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("changed since " + a.host() + "/" + lost + " was submitted"));
  EXPECT_THAT(r.output, HasSubstr("--allow-changed-spec"));
  // The resumed job trained only the steps after the bucket's checkpoint.
  int steps = 0;
  for (const auto& rec : testing::ReadMetrics(b.RunDir(resumed) + "/metrics.jsonl"))
    if (rec["event"] == "step") ++steps;
  EXPECT_EQ(steps, kSteps - uploaded->step);
}

TEST_F(AgentResumeTest, NothingToResumeFromFailsTheJobOrTheSubmitClearly) {
  ASSERT_TRUE(s3_->CreateBucket("empty").ok());
  const std::string spec = testing::WriteTinyJobSpec(
      dir_.path(),
      "train: {max_steps: 2, batch_size: 4}\ncheckpoint: {endpoint_url: " + server_->endpoint() + "}\n");
  DetachedAgent b(dir_.path() + "/b", server_->ClientEnv());
  ASSERT_TRUE(b.Start());
  // With the host's own credentials the host finds out: the job fails, and says why.
  auto failed = [&](const std::string& job) {
    nlohmann::json st;
    testing::WaitFor(
        [&] {
          st = JobStatus(b, job);
          return st.value("state", "") == "FAILED" || st.value("state", "") == "SUCCEEDED";
        },
        std::chrono::seconds(60), std::chrono::milliseconds(100));
    EXPECT_EQ(st.value("state", ""), "FAILED") << st.dump();
    return st.contains("nodes") ? st["nodes"][0].value("reason", "") : std::string();
  };
  std::string job = Submit(b, spec, {"--resume-from", "s3://empty/none"});
  ASSERT_NE(job, "");
  EXPECT_THAT(failed(job), HasSubstr("resume: s3://empty/none has no complete checkpoint"));
  job = Submit(b, spec, {"--resume-from", "s3://no-such-bucket/x"});
  ASSERT_NE(job, "");
  EXPECT_THAT(failed(job), HasSubstr("NoSuchBucket"));
  auto logs = Sftctl({"logs", b.host() + "/" + job});
  EXPECT_THAT(logs.output, HasSubstr("resume: s3://no-such-bucket/x"));
  // With forwarded credentials the client checks first: no job is made.
  auto r = Sftctl({"submit", "--host", b.host(), spec, "--cpu-ranks", "1", "--resume-from", "s3://empty/none",
                   "--forward-aws-credentials"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("resume: s3://empty/none has no complete checkpoint"));
  auto list = Sftctl({"list", "--host", b.host(), "--json"});
  const auto listed = nlohmann::json::parse(
      list.output.substr(std::min(list.output.find('{'), list.output.size())), nullptr, false);
  ASSERT_TRUE(listed.is_object()) << list.output;
  EXPECT_EQ(listed["jobs"].size(), 2u) << list.output;  // the two failed ones only
  r = Sftctl({"submit", "--host", b.host(), spec, "--resume-from", "gs://x/y"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--resume-from"));
}

}  // namespace
}  // namespace sftctl
