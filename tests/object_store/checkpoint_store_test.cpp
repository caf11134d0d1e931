// Checkpoints in a bucket (common/object_store/checkpoint_store.h, checkpoint_uploader.h) against
// moto_server in strict mode: manifest last, newest complete checkpoint, verified download, keep,
// the background uploader and its restart.
#include "common/object_store/checkpoint_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "common/object_store/checkpoint_uploader.h"
#include "common/object_store/manifest_key.h"
#include "common/sha256.h"
#include "tests/object_store/s3_server.h"
#include "tests/util/file_util.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"

namespace sftctl {
namespace {

namespace fs = std::filesystem;
using ::sftctl::testing::StatusIs;
using ::testing::HasSubstr;

std::string RandomBytes(size_t n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

// A complete checkpoint folder as the trainer writes it (weights big enough for a multipart upload).
std::string MakeCheckpoint(const std::string& run, int64_t step, size_t weight_bytes = 6u << 20) {
  char name[32];
  std::snprintf(name, sizeof(name), "checkpoint-%06lld", static_cast<long long>(step));
  const std::string dir = run + "/" + name;
  fs::create_directories(dir + "/sub");
  testing::WriteWholeFile(dir + "/model.safetensors", RandomBytes(weight_bytes, static_cast<unsigned>(step)));
  testing::WriteWholeFile(dir + "/trainer_state.json", "{\"step\": " + std::to_string(step) + "}\n");
  testing::WriteWholeFile(dir + "/sub/tokenizer.json", "{}");
  testing::WriteWholeFile(dir + "/DONE", "");
  return dir;
}

std::vector<std::string> Keys(const S3Client& s3, const std::string& bucket, const std::string& prefix) {
  std::vector<std::string> out;
  auto listed = s3.ListObjects(bucket, prefix);
  if (listed.ok())
    for (const auto& o : *listed) out.push_back(o.key);
  return out;
}

class CheckpointStoreTest : public testing::S3SuiteTest<CheckpointStoreTest> {
 protected:
  void SetUp() override {
    S3SuiteTest::SetUp();
    if (HasFatalFailure()) return;
    s3_ = NewClient("");
    opt_.part_size = 5u << 20;
    opt_.parallel = 2;
  }
  S3Client& s3() { return *s3_; }
  // Uploader options to s3://bucket/prefix for `run`, polling every 20 ms, each line logged kept in
  // lines() (thread-safe).
  CheckpointUploaderOptions UploaderOptions(const std::string& bucket, const std::string& prefix,
                                            const std::string& run, int64_t keep) {
    CheckpointUploaderOptions o;
    o.dest = S3Location{bucket, prefix};
    o.run_dir = run;
    o.keep = keep;
    o.poll = std::chrono::milliseconds(20);
    o.log = [this](const std::string& l) {
      std::lock_guard<std::mutex> g(lines_mu_);
      lines_.push_back(l);
    };
    return o;
  }
  std::vector<std::string> lines() {
    std::lock_guard<std::mutex> g(lines_mu_);
    return lines_;
  }

  std::unique_ptr<S3Client> s3_;
  TransferOptions opt_;
  std::mutex lines_mu_;
  std::vector<std::string> lines_;
};

TEST_F(CheckpointStoreTest, UploadThenDownloadTheNewestCompleteCheckpoint) {
  ASSERT_TRUE(s3().CreateBucket("ckpt").ok());
  testing::TempDir run("s3run");
  const S3Location loc{"ckpt", "runs/a"};
  EXPECT_FALSE(NewestBucketCheckpoint(s3(), loc)->has_value());
  const std::string c2 = MakeCheckpoint(run.path(), 2), c4 = MakeCheckpoint(run.path(), 4);
  ASSERT_TRUE(UploadCheckpoint(s3(), loc, c2, opt_).ok());
  // A later upload that was stopped before its manifest: no reader takes it.
  std::atomic<bool> cancel{true};
  TransferOptions cancelled = opt_;
  cancelled.cancel = &cancel;
  EXPECT_THAT(UploadCheckpoint(s3(), loc, c4, cancelled),
              StatusIs(StatusCode::kCancelled, HasSubstr("cancelled")));
  auto newest = NewestBucketCheckpoint(s3(), loc);
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  ASSERT_TRUE(newest->has_value());
  EXPECT_EQ((*newest)->name, "checkpoint-000002");
  ASSERT_TRUE(UploadCheckpoint(s3(), loc, c4, opt_).ok());
  newest = NewestBucketCheckpoint(s3(), loc);
  ASSERT_TRUE(newest.ok() && newest->has_value());
  EXPECT_EQ((*newest)->step, 4);
  EXPECT_EQ((*newest)->files.size(), 4u);  // DONE, model, sub/tokenizer.json, trainer_state.json

  testing::TempDir dest("s3dest");
  ASSERT_TRUE(DownloadCheckpoint(s3(), loc, **newest, dest.path(), opt_).ok());
  for (const char* f : {"model.safetensors", "trainer_state.json", "sub/tokenizer.json", "DONE"})
    EXPECT_EQ(testing::ReadWholeFile(dest.path() + "/checkpoint-000004/" + f),
              testing::ReadWholeFile(c4 + "/" + f))
        << f;
  // A file changed in the bucket after the manifest was written: the download says so.
  ASSERT_TRUE(s3().PutObject("ckpt", "runs/a/checkpoint-000004/trainer_state.json", "{\"step\": 5}\n").ok());
  testing::TempDir dest2("s3dest");
  EXPECT_THAT(DownloadCheckpoint(s3(), loc, **newest, dest2.path(), opt_),
              StatusIs(StatusCode::kDataLoss, HasSubstr("trainer_state.json")));
  EXPECT_FALSE(fs::exists(dest2.path() + "/checkpoint-000004/DONE"));
}

// Issue 37, item 3: a copy of a run's checkpoint planted as checkpoint-000099 with a manifest that is
// consistent with its files was taken for the newest. A run signs its manifests with its key
// (common/object_store/manifest_key.h); a resume with that key passes over any checkpoint not signed
// with it, and names them when none is.
TEST_F(CheckpointStoreTest, AResumeTakesOnlyCheckpointsSignedWithItsKey) {
  ASSERT_TRUE(s3().CreateBucket("signed").ok());
  testing::TempDir run("s3sign");
  const S3Location loc{"signed", "runs/a"};
  const std::string key = DeriveRunKey("master key of this laptop", loc.Url());
  EXPECT_NE(key, DeriveRunKey("master key of this laptop", "s3://signed/runs/b"));
  ASSERT_TRUE(UploadCheckpoint(s3(), loc, MakeCheckpoint(run.path(), 6, 1000), opt_, nullptr, key).ok());
  auto text = s3().GetObject("signed", "runs/a/checkpoint-000006/MANIFEST.json", 1 << 20);
  ASSERT_TRUE(text.ok());
  EXPECT_THAT(*text, HasSubstr("\"signature\": \"hmac-sha256:"));

  // The planted copy: the same files under checkpoint-000099, its manifest recomputed, unsigned.
  auto m = ParseManifest(*text, "m");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const std::string planted = run.path() + "/planted/checkpoint-000099";
  fs::create_directories(fs::path(planted).parent_path());
  fs::copy(run.path() + "/checkpoint-000006", planted, fs::copy_options::recursive);
  ASSERT_TRUE(UploadCheckpoint(s3(), loc, planted, opt_).ok());
  // Without a key (pull, an agent the client sent none): the newest consistent one, as before.
  auto newest = NewestBucketCheckpoint(s3(), loc);
  ASSERT_TRUE(newest.ok() && newest->has_value());
  EXPECT_EQ((*newest)->step, 99);
  // With the run's key: the planted one is passed over.
  newest = NewestBucketCheckpoint(s3(), loc, key);
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  ASSERT_TRUE(newest->has_value());
  EXPECT_EQ((*newest)->step, 6);
  // A signature copied from the real manifest onto the planted one does not verify either.
  CheckpointManifest forged = *m;
  forged.name = "checkpoint-000099";
  forged.step = 99;
  ASSERT_TRUE(s3().PutObject("signed", "runs/a/checkpoint-000099/MANIFEST.json", forged.ToJson()).ok());
  newest = NewestBucketCheckpoint(s3(), loc, key);
  ASSERT_TRUE(newest.ok() && newest->has_value());
  EXPECT_EQ((*newest)->step, 6);
  // Another run's key (another laptop, another prefix's key): nothing is its own, and it says so.
  EXPECT_THAT(NewestBucketCheckpoint(s3(), loc, DeriveRunKey("another master key", loc.Url())),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("no checkpoint there is signed with this run's key (checkpoint-000099, "
                                 "checkpoint-000006 are not")));
}

// A bucket filled with strangers costs a resume a bounded number of reads, and its message a bounded
// number of names.
TEST_F(CheckpointStoreTest, ABucketOfStrangersIsReadOnlySoFar) {
  ASSERT_TRUE(s3().CreateBucket("crowd").ok());
  const S3Location loc{"crowd", "run"};
  for (int step = 1; step <= 70; ++step) {
    CheckpointManifest m;
    m.step = step;
    m.name = CheckpointName(step);
    ASSERT_TRUE(s3().PutObject("crowd", "run/" + m.name + "/MANIFEST.json", m.ToJson()).ok());
  }
  EXPECT_THAT(
      NewestBucketCheckpoint(s3(), loc, DeriveRunKey("this laptop", loc.Url())),
      StatusIs(StatusCode::kFailedPrecondition,
               HasSubstr("no checkpoint there among its newest 64 is signed with this run's key "
                         "(checkpoint-000070, checkpoint-000069, checkpoint-000068, checkpoint-000067, "
                         "checkpoint-000066 and 59 older ones are not")));
}

TEST_F(CheckpointStoreTest, ManifestsFromTheBucketAreChecked) {
  const std::string sha(64, 'a');
  auto good = ParseManifest(
      R"({"format":1,"step":3,"name":"checkpoint-000003","files":[{"path":"a/b","size":1,"sha256":")" + sha +
          "\"}]}",
      "s3://b/m");
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(good->files[0].path, "a/b");
  EXPECT_THAT(
      ParseManifest(
          R"({"format":1,"step":3,"name":"checkpoint-000003","files":[{"path":"../x","size":1,"sha256":")" +
              sha + "\"}]}",
          "s3://b/m"),
      StatusIs(StatusCode::kDataLoss, HasSubstr("s3://b/m: not a checkpoint manifest")));
  EXPECT_THAT(ParseManifest(R"({"format":1,"step":4,"name":"checkpoint-000003","files":[]})", "s3://b/m"),
              StatusIs(StatusCode::kDataLoss, HasSubstr("is not step 4")));
  EXPECT_THAT(ParseManifest(R"({"format":2})", "s3://b/m"),
              StatusIs(StatusCode::kDataLoss, HasSubstr("format")));
  EXPECT_THAT(ParseManifest("{", "s3://b/m"), StatusIs(StatusCode::kDataLoss, HasSubstr("s3://b/m")));
  // Fields of the wrong type, or missing (issue 37: a file entry without "path" was read with a const
  // operator[], undefined behaviour), are named.
  EXPECT_THAT(ParseManifest(R"({"format":1,"step":1,"name":"checkpoint-000001","files":[{}]})", "s3://b/m"),
              StatusIs(StatusCode::kDataLoss,
                       "s3://b/m: not a checkpoint manifest: a file entry: field 'path': "
                       "missing (expected a string)"));
  EXPECT_THAT(ParseManifest(R"({"format":1,"step":"1","name":"checkpoint-000001","files":[]})", "s3://b/m"),
              StatusIs(StatusCode::kDataLoss,
                       "s3://b/m: not a checkpoint manifest: field 'step': expected an integer, got string"));
  EXPECT_THAT(
      ParseManifest(R"({"format":1,"step":1,"name":"checkpoint-000001","files":[{"path":"a","size":-1}]})",
                    "s3://b/m"),
      StatusIs(
          StatusCode::kDataLoss,
          "s3://b/m: not a checkpoint manifest: 'a': field 'size': expected an integer >= 0, got number -1"));
}

TEST_F(CheckpointStoreTest, PruneKeepsTheNewestComplete) {
  ASSERT_TRUE(s3().CreateBucket("prune").ok());
  testing::TempDir run("s3run");
  const S3Location loc{"prune", ""};
  for (int step : {1, 2, 3})
    ASSERT_TRUE(UploadCheckpoint(s3(), loc, MakeCheckpoint(run.path(), step, 10), opt_).ok());
  ASSERT_TRUE(s3().PutObject("prune", "checkpoint-000009/model.safetensors", "partial").ok());  // under way
  auto removed = PruneBucketCheckpoints(s3(), loc, 2);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_THAT(*removed, ::testing::ElementsAre("checkpoint-000001"));
  EXPECT_TRUE(Keys(s3(), "prune", "checkpoint-000001/").empty());
  EXPECT_FALSE(Keys(s3(), "prune", "checkpoint-000002/").empty());
  EXPECT_FALSE(Keys(s3(), "prune", "checkpoint-000009/").empty());
}

TEST_F(CheckpointStoreTest, UploaderFollowsTheRunAndResumesAfterARestart) {
  ASSERT_TRUE(s3().CreateBucket("follow").ok());
  testing::TempDir run("s3run");
  testing::WriteWholeFile(run.path() + "/spec.json", "{\"name\":\"x\"}\n");
  testing::WriteWholeFile(run.path() + "/metrics.jsonl", "{\"step\":1}\n");
  // A killed uploader's staged checkpoint (hard links of checkpoint-000001, since pruned by the trainer).
  MakeCheckpoint(run.path() + "/.s3-upload", 1, 100);
  MakeCheckpoint(run.path(), 2, 100);
  CheckpointUploaderOptions o = UploaderOptions("follow", "r", run.path(), 1);
  o.transfer = opt_;
  CheckpointUploader up(s3(), o);
  up.Start();
  MakeCheckpoint(run.path(), 3, 6u << 20);
  ASSERT_TRUE(up.Finish(std::chrono::seconds(60)).ok());
  EXPECT_EQ(up.uploaded_step(), 3);
  auto newest = NewestBucketCheckpoint(s3(), o.dest);
  ASSERT_TRUE(newest.ok() && newest->has_value());
  EXPECT_EQ((*newest)->name, "checkpoint-000003");
  EXPECT_EQ(*s3().GetObject("follow", "r/metrics.jsonl"), "{\"step\":1}\n");
  EXPECT_EQ(*s3().GetObject("follow", "r/spec.json"), "{\"name\":\"x\"}\n");
  EXPECT_TRUE(Keys(s3(), "follow", "r/checkpoint-000001/").empty());  // keep: 1
  EXPECT_TRUE(Keys(s3(), "follow", "r/checkpoint-000002/").empty());
  EXPECT_TRUE(fs::is_empty(run.path() + "/.s3-upload"));
  EXPECT_THAT(lines(), ::testing::Contains(HasSubstr("resuming the upload of checkpoint-000001")));
  EXPECT_THAT(lines(), ::testing::Contains(HasSubstr("uploaded checkpoint-000003 to s3://follow/r")));
}

TEST_F(CheckpointStoreTest, UploaderSkipsIntermediateCheckpointsWhenBehindButNeverTheLast) {
  ASSERT_TRUE(s3().CreateBucket("behind").ok());
  testing::TempDir run("s3run");
  for (int step = 1; step <= 6; ++step) MakeCheckpoint(run.path(), step, 10);  // more than the queue holds
  CheckpointUploader up(s3(), UploaderOptions("behind", "", run.path(), 10));
  up.Start();
  ASSERT_TRUE(up.Finish(std::chrono::seconds(60)).ok());
  EXPECT_EQ(up.uploaded_step(), 6);
  int uploaded = 0, skipped = 0;
  for (const auto& l : lines()) {
    uploaded += l.find("uploaded checkpoint-") != std::string::npos;
    skipped += l.find("skipping the upload of checkpoint-") != std::string::npos;
  }
  // One uploading and kMaxQueued waiting: at least 6 - 3 were skipped, each said so, the rest uploaded.
  EXPECT_GE(skipped, 6 - 1 - static_cast<int>(CheckpointUploader::kMaxQueued));
  EXPECT_EQ(uploaded + skipped, 6);
  EXPECT_EQ(Keys(s3(), "behind", "checkpoint-000006/").size(), 5u);  // 4 files + MANIFEST.json
}

// checkpoint.upload: final: the run's checkpoints stay put while it trains; Finish sends the newest
// only, as a complete checkpoint with its manifest (a later resume reads it like any other).
TEST_F(CheckpointStoreTest, FinalOnlyUploaderSendsTheLastCheckpointAtFinish) {
  ASSERT_TRUE(s3().CreateBucket("final").ok());
  testing::TempDir run("s3run");
  for (int step = 1; step <= 3; ++step) MakeCheckpoint(run.path(), step, 10);
  CheckpointUploaderOptions o = UploaderOptions("final", "r", run.path(), 10);
  o.final_only = true;
  CheckpointUploader up(s3(), o);
  up.Start();
  ASSERT_TRUE(up.Finish(std::chrono::seconds(60)).ok());
  EXPECT_EQ(up.uploaded_step(), 3);
  EXPECT_TRUE(Keys(s3(), "final", "r/checkpoint-000001/").empty());
  EXPECT_TRUE(Keys(s3(), "final", "r/checkpoint-000002/").empty());
  EXPECT_EQ(Keys(s3(), "final", "r/checkpoint-000003/").size(), 5u);  // 4 files + MANIFEST.json
  auto newest = NewestBucketCheckpoint(s3(), S3Location{"final", "r"});
  ASSERT_TRUE(newest.ok() && newest->has_value());
  EXPECT_EQ((*newest)->step, 3);
  EXPECT_THAT(lines(), ::testing::ElementsAre(HasSubstr("uploaded checkpoint-000003 to s3://final/r")));
}

TEST_F(CheckpointStoreTest, UploaderReportsAMissingBucket) {
  testing::TempDir run("s3run");
  MakeCheckpoint(run.path(), 1, 10);
  CheckpointUploaderOptions o;
  o.dest = S3Location{"no-such-bucket", "r"};
  o.run_dir = run.path();
  o.poll = std::chrono::milliseconds(20);
  CheckpointUploader up(s3(), o);
  up.Start();
  EXPECT_THAT(up.Finish(std::chrono::seconds(60)),
              StatusIs(StatusCode::kNotFound, HasSubstr("NoSuchBucket")));
  EXPECT_TRUE(fs::exists(run.path() + "/.s3-upload/checkpoint-000001/DONE"));  // kept for a later try
}

}  // namespace
}  // namespace sftctl
