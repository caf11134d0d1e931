// The Supervisor's checkpoint uploads go through the CheckpointUploads its builder hands it (no
// process-wide instance): here one whose environment alone holds the key of a strict S3 test server
// (moto, tests/object_store/s3_server.h). A job of the stub trainer with checkpoint.upload_to ends with
// its checkpoints in the bucket, which no other uploader in this process could have signed for.
#include <gtest/gtest.h>
#include <signal.h>

#include <future>
#include <map>
#include <optional>

#include "agent/jobs/checkpoint_upload.h"
#include "agent/jobs/supervisor.h"
#include "common/object_store/checkpoint_store.h"
#include "common/object_store/s3_client.h"
#include "tests/agent/agent_test_util.h"
#include "tests/object_store/s3_server.h"

namespace sftctl::agent {
namespace {

using ::sftctl::agent::testing::StubPath;
using ::sftctl::agent::testing::StubSpec;
using ::sftctl::agent::testing::TempDir;
using ::sftctl::testing::WaitFor;
using namespace std::chrono_literals;

TEST(SupervisorUploads, CheckpointsGoThroughTheUploaderTheSupervisorIsGiven) {
  ::sftctl::testing::S3Server server;
  ASSERT_EQ(server.Start(/*strict=*/true), "") << "deploy/install-deps.sh installs moto";
  S3Client s3(S3Endpoint{server.endpoint(), ""},
              AwsCredentials{server.access_key(), server.secret_key(), "", "test"});
  ASSERT_TRUE(s3.CreateBucket("bucket").ok());

  TempDir dir;
  auto store = StateStore::Open(dir.path() + "/agent.db");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  BlobStore blobs(dir.path() + "/blobs", store->get());
  ASSERT_TRUE(blobs.Init().ok());
  // The uploader's own environment: the server's key, which the process's environment does not hold.
  const std::map<std::string, std::string> env = {{"AWS_ACCESS_KEY_ID", server.access_key()},
                                                  {"AWS_SECRET_ACCESS_KEY", server.secret_key()}};
  CheckpointUploads uploads([env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
  SupervisorConfig cfg;
  cfg.data_dir = dir.path();
  cfg.trainer_path = StubPath();
  cfg.poll = 20ms;
  Supervisor supervisor(cfg, store->get(), &blobs, &uploads);
  ASSERT_TRUE(supervisor.Start().ok());

  nlohmann::json spec = StubSpec({{"steps", 4}, {"checkpoint_every", 2}, {"step_ms", 5}});
  spec["checkpoint"] = {{"upload_to", "s3://bucket/job"}, {"endpoint_url", server.endpoint()}};
  v1::SubmitJobRequest req;
  req.set_spec_json(spec.dump());
  std::promise<StatusOr<JobRecord>> submitted;
  supervisor.Submit(req, [&](StatusOr<JobRecord> r) { submitted.set_value(std::move(r)); });
  StatusOr<JobRecord> job = submitted.get_future().get();
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  JobRecord seen;
  ASSERT_TRUE(WaitFor([&] {
    auto rec = store->get()->GetJob(job->id);
    if (rec.ok()) seen = *rec;
    return rec.ok() && IsFinal(rec->state);
  }));
  EXPECT_EQ(seen.state, JobState::SUCCEEDED) << seen.reason;

  // The uploader finishes the last checkpoint after the job ended.
  std::optional<CheckpointManifest> newest;
  Status listing;
  EXPECT_TRUE(WaitFor([&] {
    auto got = NewestBucketCheckpoint(s3, S3Location{"bucket", "job"});
    listing = got.status();
    if (got.ok()) newest = *got;
    return !got.ok() || (newest && newest->step == 4);
  }));
  ASSERT_TRUE(listing.ok()) << listing.ToString() << "\n" << server.Log();
  ASSERT_TRUE(newest.has_value()) << "no checkpoint reached the bucket\n" << server.Log();
  EXPECT_EQ(newest->step, 4);
  supervisor.Stop();
  if (seen.pgid > 0) ::killpg(static_cast<pid_t>(seen.pgid), SIGKILL);  // nothing should be left
}

}  // namespace
}  // namespace sftctl::agent
