// agent/jobs/hub_fetcher.h against a fake Hub (tests/util/fake_hub.py): the rewritten spec, and the
// progress a job's status shows while it waits for its download (here: for the blob's lock, held by
// the test as another Hugging Face client would hold it).
#include "agent/jobs/hub_fetcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>

#include "agent/state/job_spec.h"
#include "common/os/file_lock.h"
#include "common/sha256.h"
#include "tests/util/fake_hub.h"
#include "tests/util/file_util.h"
#include "tests/util/temp_dir.h"
#include "tests/util/wait_for.h"

namespace sftctl::agent {
namespace {

using ::sftctl::testing::FakeHub;
using ::sftctl::testing::TempDir;
using ::sftctl::testing::WaitFor;
using ::sftctl::testing::WriteWholeFile;
namespace fs = std::filesystem;

TEST(HubFetcherTest, ProgressShowsTheWaitAndTheBytesThenClears) {
  TempDir tmp("hub-fetcher");
  const std::string weights(3 << 20, 'w');
  WriteWholeFile(tmp.path() + "/model/config.json", "{}");
  WriteWholeFile(tmp.path() + "/model/model.safetensors", weights);
  FakeHub hub;
  ASSERT_TRUE(hub.Start(tmp.path(), {{"repos", {{"org/tiny", {{"dir", tmp.path() + "/model"}}}}}}));
  HubOptions o;
  o.endpoint = hub.url();
  o.cache_dir = tmp.path() + "/cache";
  HubFetcher fetcher(o);

  const std::string locks = o.cache_dir + "/.locks/models--org--tiny";
  fs::create_directories(locks);
  auto held = FileLock::Acquire(locks + "/" + Sha256Hex(weights) + ".lock");
  ASSERT_TRUE(held.ok());
  std::optional<FileLock> other(std::move(*held));

  fs::create_directories(tmp.path() + "/job-1");
  auto job_spec = std::make_shared<JobSpec>();
  job_spec->model.path = "hf://org/tiny";
  job_spec->data.train = {"/data/train.jsonl"};
  std::promise<StatusOr<std::shared_ptr<const JobSpec>>> result;
  fetcher.Fetch({"job-1", job_spec, ""},
                [&](const std::string&, StatusOr<std::shared_ptr<const JobSpec>> spec) {
                  result.set_value(std::move(spec));
                });
  std::string seen;  // config.json may show first; then the weights wait for the lock
  WaitFor([&] { return (seen = fetcher.Progress("job-1")).find("waiting") != std::string::npos; });
  EXPECT_EQ(seen, "model.safetensors (waiting for another download)");
  EXPECT_EQ(fetcher.Progress("job-2"), "");  // another job: nothing
  other.reset();                             // the other client gives up: this one downloads

  auto spec = result.get_future().get();
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_THAT((*spec)->model.path, ::testing::StartsWith(o.cache_dir + "/models--org--tiny/snapshots/"));
  EXPECT_EQ((*spec)->data.train, job_spec->data.train);  // a local path stays as it is
  EXPECT_EQ(job_spec->model.path, "hf://org/tiny") << "a new spec; the job's own is never changed";
  EXPECT_TRUE(fs::is_empty(tmp.path() + "/job-1")) << "the Supervisor, not the fetcher, saves spec.json";
  EXPECT_EQ(fetcher.Progress("job-1"), "");  // done: no progress left behind
}

}  // namespace
}  // namespace sftctl::agent
