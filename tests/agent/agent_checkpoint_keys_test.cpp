// A job's checkpoint run keys (SubmitJobRequest.checkpoint_keys, common/object_store/manifest_key.h)
// outlive an agent restart: the real sftd (stub trainer) against a strict moto S3 server
// (tests/object_store/s3_server.h), restarted by SIGTERM (`sftd stop`) or SIGKILL.
//   - A job queued with `resume: s3://...` whose download a restart interrupted resumes, after the
//     restart, from the newest checkpoint signed with its key, never from a newer unsigned one planted
//     in the bucket, and signs what it uploads.
//   - A running job that a restarted agent takes back keeps signing its uploads.
// The keys reach no log line, no journal and no answer to a client.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "common/object_store/checkpoint_store.h"
#include "common/object_store/manifest_key.h"  // SignatureMatches
#include "common/object_store/s3_client.h"
#include "tests/agent/agent_test_util.h"
#include "tests/object_store/s3_server.h"
#include "tests/util/tcp_relay.h"

namespace sftctl::agent::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A run key (any bytes do; printable here, so that a leak into JSON or a log is found as it is).
std::string RunKey(const std::string& url) { return "run-key-of " + url + " 7f3a9c"; }

// The agent restarted by `sftd stop` (SIGTERM) or by a crash (SIGKILL).
enum class Restart { kStop, kKill };
std::string RestartName(const ::testing::TestParamInfo<Restart>& p) {
  return p.param == Restart::kStop ? "Sigterm" : "Sigkill";
}

class AgentCheckpointKeysTest : public ::sftctl::testing::S3SuiteTest<AgentCheckpointKeysTest>,
                                public ::testing::WithParamInterface<Restart> {
 protected:
  void SetUp() override {
    S3SuiteTest::SetUp();
    if (HasFatalFailure()) return;
    s3_ = NewClient("");
    bucket_ = std::string("keys-") + (GetParam() == Restart::kStop ? "stop" : "kill");
    ASSERT_TRUE(s3_->CreateBucket(bucket_).ok());
  }

  // A complete checkpoint folder of the stub trainer's shape, uploaded to <prefix>/checkpoint-<step>,
  // signed with `run_key` ("": unsigned, as a planted one).
  void PutCheckpoint(const std::string& prefix, int step, const std::string& run_key) {
    char name[32];
    std::snprintf(name, sizeof(name), "checkpoint-%06d", step);
    const std::string folder = dir_.path() + "/plant/" + name;
    std::filesystem::create_directories(folder);
    WriteWholeFile(folder + "/model.bin", "weights of step " + std::to_string(step));
    WriteWholeFile(folder + "/DONE", "ok\n");
    ASSERT_TRUE(
        UploadCheckpoint(*s3_, S3Location{bucket_, prefix}, folder, TransferOptions(), nullptr, run_key)
            .ok());
  }

  // The manifest of <prefix>/<name> once it is in the bucket (waited for: the agent uploads a job's last
  // checkpoint after the job ended), else nullopt.
  std::optional<CheckpointManifest> WaitManifest(const std::string& prefix, const std::string& name) {
    std::optional<CheckpointManifest> m;
    WaitFor([&] {
      auto text = s3_->GetObject(bucket_, prefix + "/" + name + "/MANIFEST.json", 1 << 20);
      if (!text.ok()) return false;
      auto parsed = ParseManifest(*text, name);
      if (parsed.ok()) m = std::move(*parsed);
      return parsed.ok();
    });
    return m;
  }

  // Stops or kills `a` (per the test's parameter). `release`, when given, lets a held resume download go
  // once the agent can no longer act on it: a SIGTERM'd agent waits for its downloads, and would launch
  // the job itself if the download ended before it had stopped it (its log says when it has).
  void RestartAgent(Agent& a, const std::string& log, const std::function<void()>& release = nullptr) {
    if (GetParam() == Restart::kKill) {
      a.Kill();
      if (release) release();
      return;
    }
    std::thread stop([&a] { a.Stop(); });
    if (release) {
      EXPECT_TRUE(WaitFor([&] {
        return ReadWholeFile(log).find("resume download stopped") != std::string::npos;
      })) << ReadWholeFile(log);
      release();
    }
    stop.join();
  }

  v1::Job Submit(Agent& a, const nlohmann::json& spec, const std::string& url, const std::string& key) {
    v1::SubmitJobRequest req;
    req.set_spec_json(spec.dump());
    (*req.mutable_checkpoint_keys())[url] = key;
    v1::Job job;
    grpc::Status s = a.stub()->SubmitJob(a.Ctx().get(), req, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }

  // The key is in none of the agent's logs or journals and in no answer it gives a client.
  void ExpectKeyNowhere(Agent& a, const std::string& job, const std::string& key, const std::string& log) {
    const std::string journal = a.data_dir() + "/jobs/" + job + "/journal.jsonl";
    for (const std::string& text :
         {ReadWholeFile(log), ReadWholeFile(journal), a.Get(job).SerializeAsString()})
      EXPECT_EQ(text.find(key), std::string::npos) << "the run key leaked";
    v1::ListJobsResponse list;
    ASSERT_TRUE(a.stub()->ListJobs(a.Ctx().get(), v1::ListJobsRequest(), &list).ok());
    EXPECT_EQ(list.SerializeAsString().find(key), std::string::npos);
  }

  TempDir dir_;
  std::unique_ptr<S3Client> s3_;
  std::string bucket_;
};

// The job had picked the signed checkpoint-000006 (its download held in flight) when the agent went
// down; the bucket also holds a planted, unsigned, newer checkpoint-000099. The restarted agent
// downloads checkpoint-000006 again, the trainer resumes from it, and the checkpoints it writes are
// signed with the job's key.
TEST_P(AgentCheckpointKeysTest, AQueuedResumeNeverTakesAnUnsignedCheckpointAfterARestart) {
  const std::string url = "s3://" + bucket_ + "/run", key = RunKey(url);
  PutCheckpoint("run", 6, key);
  PutCheckpoint("run", 99, "");  // planted: consistent with its files, not signed
  const std::string endpoint = server_->endpoint();
  ::sftctl::testing::TcpRelay relay(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
  ASSERT_GT(relay.port(), 0);
  const std::string log = dir_.path() + "/sftd.log";
  Agent a(dir_.path() + "/data");
  a.set_env(server_->ClientEnv());  // the host's own S3 credentials
  a.set_stderr_file(log);
  ASSERT_TRUE(a.Start());
  nlohmann::json spec = StubSpec({{"steps", 10}, {"checkpoint_every", 2}, {"step_ms", 20}});
  spec["resume"] = url;
  spec["checkpoint"] = {{"upload_to", url},
                        {"endpoint_url", "http://127.0.0.1:" + std::to_string(relay.port())},
                        {"keep", 100}};
  relay.Hold();
  const v1::Job job = Submit(a, spec, url, key);
  ASSERT_FALSE(job.id().empty());
  ASSERT_TRUE(WaitFor([&] { return relay.held() > 0; })) << "the resume download never began";
  EXPECT_THAT(a.Get(job.id()).reason(), HasSubstr("downloading the checkpoint to resume from: " + url));
  RestartAgent(a, log, [&] { relay.Release(/*drop_held=*/true); });

  Agent b(dir_.path() + "/data");
  b.set_env(server_->ClientEnv());
  b.set_stderr_file(log);
  ASSERT_TRUE(b.Start());
  const v1::Job done = b.WaitJob(job.id(), [](const v1::Job& j) {
    return j.state() == v1::SUCCEEDED || j.state() == v1::FAILED || j.state() == v1::CANCELLED;
  });
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  bool downloaded = false;
  std::string out;
  for (const v1::Event& e : b.Events(job.id(), 0, false)) {
    if (e.kind() == v1::Event::STATE)
      downloaded |= e.text() == "downloaded " + url + "/checkpoint-000006 to resume from";
    if (e.kind() == v1::Event::STDOUT) out += e.text() + "\n";
  }
  EXPECT_TRUE(downloaded) << "no 'downloaded " << url << "/checkpoint-000006' in the job's history";
  EXPECT_THAT(out, HasSubstr("resume_from=6"));
  EXPECT_THAT(out, Not(HasSubstr("resume_from=99")));
  const std::string run = b.data_dir() + "/jobs/" + job.id() + "/run";
  EXPECT_FALSE(std::filesystem::exists(run + "/checkpoint-000099"))
      << "the planted checkpoint was downloaded";
  // What the job uploaded after the restart is signed with its key.
  for (const char* name : {"checkpoint-000008", "checkpoint-000010"}) {
    std::optional<CheckpointManifest> m = WaitManifest("run", name);
    ASSERT_TRUE(m.has_value()) << name << " never reached the bucket\n" << ReadWholeFile(log);
    EXPECT_TRUE(SignatureMatches(key, m->UnsignedJson(), m->signature))
        << name << " is not signed with the job's key";
  }
  ExpectKeyNowhere(b, job.id(), key, log);
}

// A running job, taken back by the restarted agent, signs the checkpoints it uploads from then on.
TEST_P(AgentCheckpointKeysTest, ARecoveredRunningJobKeepsSigningItsUploads) {
  const std::string url = "s3://" + bucket_ + "/live", key = RunKey(url);
  const std::string log = dir_.path() + "/sftd.log";
  Agent a(dir_.path() + "/data");
  a.set_env(server_->ClientEnv());
  a.set_stderr_file(log);
  ASSERT_TRUE(a.Start());
  nlohmann::json spec = StubSpec({{"steps", 40}, {"checkpoint_every", 4}, {"step_ms", 100}});
  spec["checkpoint"] = {{"upload_to", url}, {"endpoint_url", server_->endpoint()}, {"keep", 100}};
  const v1::Job job = Submit(a, spec, url, key);
  ASSERT_FALSE(job.id().empty());
  const v1::Job running = a.WaitJob(job.id(), [](const v1::Job& j) { return j.last_step() >= 5; });
  ASSERT_GT(running.ranks_size(), 0);
  const pid_t pgid = static_cast<pid_t>(running.ranks(0).pid());
  RestartAgent(a, log);

  Agent b(dir_.path() + "/data");
  b.set_env(server_->ClientEnv());
  b.set_stderr_file(log);
  ASSERT_TRUE(b.Start());
  const v1::Job recovered = b.Get(job.id());
  EXPECT_EQ(recovered.state(), v1::RUNNING);
  EXPECT_LT(recovered.last_step(), 36) << "the job ran out before the restart: nothing to test";
  const v1::Job done = b.WaitJob(job.id(), [](const v1::Job& j) { return j.state() != v1::RUNNING; });
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  std::optional<CheckpointManifest> last = WaitManifest("live", "checkpoint-000040");
  ASSERT_TRUE(last.has_value()) << "the final checkpoint never reached the bucket\n" << ReadWholeFile(log);
  EXPECT_TRUE(SignatureMatches(key, last->UnsignedJson(), last->signature))
      << "the recovered job uploaded an unsigned checkpoint";
  auto newest = NewestBucketCheckpoint(*s3_, S3Location{bucket_, "live"}, key);
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  ASSERT_TRUE(newest->has_value());
  EXPECT_EQ((*newest)->step, 40);
  ExpectKeyNowhere(b, job.id(), key, log);
  KillGroup(pgid);
}

INSTANTIATE_TEST_SUITE_P(Restarts, AgentCheckpointKeysTest, ::testing::Values(Restart::kStop, Restart::kKill),
                         RestartName);

}  // namespace
}  // namespace sftctl::agent::testing
