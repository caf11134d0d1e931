// Garbage collection of the agent's data dir (agent/state/gc.h): the pure plan, the collector on a real
// SQLite store and blob folder, and `sftd gc` / automatic collection with the real sftd binary.
#include "agent/state/gc.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "agent/state/blob_store.h"
#include "agent/state/job_spec.h"
#include "agent/state/state_store.h"
#include "agent_test_util.h"
#include "common/sha256.h"
#include "tests/util/status_matchers.h"

namespace sftctl::agent::testing {
namespace {

using ::sftctl::testing::StatusIs;

constexpr int64_t kDay = 86400;
constexpr int64_t kNow = 100 * kDay;

GcEntry Entry(const std::string& name, uint64_t bytes, int64_t age_s) {
  return {name, "/d/" + name, bytes, kNow - age_s};
}

std::vector<std::string> Names(const std::vector<GcRemoval>& plan) {
  std::vector<std::string> out;
  for (const GcRemoval& r : plan) out.push_back(std::string(GcKindName(r.kind)) + ":" + r.entry.name);
  return out;
}

TEST(PlanGc, RemovesByAgeButNeverWhatAJobNamesOrWhatWasJustUsed) {
  GcSnapshot snap;
  snap.blobs = {Entry("old", 10, 8 * kDay), Entry("named", 10, 30 * kDay), Entry("young", 10, 3 * kDay),
                Entry("fresh", 10, 60)};
  snap.partials = {Entry("stale", 5, 3 * kDay), Entry("recent", 5, kDay)};
  snap.finished_jobs = {Entry("job-1", 100, 31 * kDay), Entry("job-2", 100, 29 * kDay)};
  snap.referenced = {"named"};
  GcPolicy policy;  // 7 days, 2 days, 30 days
  EXPECT_EQ(Names(PlanGc(snap, policy, kNow)),
            (std::vector<std::string>{"blob:old", "partial:stale", "job:job-1"}));
  policy.job_max_age_s = -1;  // keep every job folder
  EXPECT_EQ(Names(PlanGc(snap, policy, kNow)), (std::vector<std::string>{"blob:old", "partial:stale"}));
  // Even an age of one second spares what was used within min_age_s, and what a job names.
  policy.blob_max_age_s = policy.partial_max_age_s = 1;
  EXPECT_EQ(Names(PlanGc(snap, policy, kNow)),
            (std::vector<std::string>{"blob:old", "blob:young", "partial:stale", "partial:recent"}));
  EXPECT_EQ(PlanGc(snap, policy, kNow)[1].why, "unused for 3 days");
}

TEST(PlanGc, TheSizeCapRemovesTheLeastRecentlyUsedUnreferencedBlobsFirst) {
  GcSnapshot snap;
  // Nothing here is old enough to go by age.
  snap.blobs = {Entry("a", 40, kDay), Entry("b", 40, 5 * kDay), Entry("named", 1000, 6 * kDay),
                Entry("fresh", 500, 10)};
  snap.partials = {Entry("p", 40, 3 * kDay / 2)};
  snap.referenced = {"named"};
  GcPolicy policy;
  policy.max_store_bytes = 1000 + 500 + 40 + 5;  // over by 75: the two least recently used spare ones go
  auto plan = PlanGc(snap, policy, kNow);
  EXPECT_EQ(Names(plan), (std::vector<std::string>{"blob:b", "partial:p"}));
  EXPECT_EQ(plan[0].why, "store over 1545 bytes");
  policy.max_store_bytes = 1;  // cannot be met: everything spare goes, never "named" or "fresh"
  EXPECT_EQ(Names(PlanGc(snap, policy, kNow)), (std::vector<std::string>{"blob:b", "partial:p", "blob:a"}));
  policy.max_store_bytes = 0;  // no cap
  EXPECT_TRUE(PlanGc(snap, policy, kNow).empty());
}

// Writes `data` to `path` with its times set `age_s` in the past.
void WriteAgedFile(const std::string& path, const std::string& data, int64_t age_s = 0) {
  ASSERT_TRUE(WriteWholeFile(path, data)) << path;
  if (age_s > 0) {
    timespec t[2] = {{::time(nullptr) - age_s, 0}, {::time(nullptr) - age_s, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), t, 0), 0) << path;
  }
}

bool Exists(const std::string& path) {
  return std::filesystem::exists(std::filesystem::symlink_status(path));
}

class Collector : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = StateStore::Open(dir_.path() + "/agent.db");
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
    blobs_ = std::make_unique<BlobStore>(dir_.path() + "/blobs", store_.get());
    ASSERT_TRUE(blobs_->Init().ok());
  }
  // A blob file of `data` last used `age_s` ago; returns its sha256.
  std::string Blob(const std::string& data, int64_t age_s, bool partial = false) {
    std::string sha = Sha256Hex(data);
    WriteAgedFile(dir_.path() + "/blobs/" + (partial ? "partial/" : "") + sha, data, age_s);
    return sha;
  }
  // `job_dir` empty: <data_dir>/jobs/<id>, as the supervisor makes it.
  JobRecord Job(JobState state, const std::string& spec_json, int64_t finished_days_ago,
                const std::string& job_dir = "") {
    JobRecord rec;
    rec.state = state;
    rec.job_dir = job_dir.empty() ? dir_.path() + "/jobs/" : job_dir;
    auto inserted = store_->InsertJob(rec);
    EXPECT_TRUE(inserted.ok());
    inserted->spec_json = spec_json;
    if (IsFinal(state)) inserted->finished_ms = (::time(nullptr) - finished_days_ago * kDay) * 1000;
    EXPECT_TRUE(store_->SaveJob(*inserted, nullptr).ok());
    WriteAgedFile(inserted->job_dir + "/run/checkpoint-000001/model.safetensors", "weights");
    return *inserted;
  }
  std::string BlobPath(const std::string& sha) { return dir_.path() + "/blobs/" + sha; }
  // A job spec whose training data is `path`.
  std::shared_ptr<const JobSpec> SpecNaming(const std::string& path) {
    auto spec = std::make_shared<JobSpec>();
    spec->model.config = nlohmann::json::object();
    spec->data.train = {path};
    return spec;
  }

  TempDir dir_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<BlobStore> blobs_;
};

TEST_F(Collector, KeepsWhatQueuedAndRunningJobsUseAndRemovesTheRest) {
  const std::string in_spec = Blob("train data", 30 * kDay);
  const std::string in_symlink = Blob("tokenizer", 30 * kDay);
  const std::string of_finished = Blob("old eval data", 30 * kDay);
  const std::string young = Blob("uploaded yesterday", kDay);
  const std::string stale_partial = Blob("half an upl", 5 * kDay, /*partial=*/true);
  JobRecord queued = Job(JobState::QUEUED, CanonicalSpecJson(*SpecNaming(BlobPath(in_spec))), 0);
  JobRecord running = Job(JobState::RUNNING, "{}", 0);
  std::filesystem::create_directories(running.job_dir + "/inputs/0");
  std::filesystem::create_symlink(BlobPath(in_symlink), running.job_dir + "/inputs/0/tokenizer.json");
  JobRecord old_done = Job(JobState::SUCCEEDED, nlohmann::json{{"x", BlobPath(of_finished)}}.dump(), 40);
  JobRecord recent_done = Job(JobState::FAILED, "{}", 3);
  // A finished job's folder holds a link to a file outside the data dir: removing the folder
  // removes the link, never its target.
  TempDir outside;
  WriteAgedFile(outside.path() + "/precious", "user data");
  std::filesystem::create_symlink(outside.path(), old_done.job_dir + "/run/link");

  GarbageCollector gc(dir_.path(), store_.get(), blobs_.get());
  auto dry = gc.Run(GcPolicy{}, /*dry_run=*/true);
  ASSERT_TRUE(dry.ok()) << dry.status().ToString();
  EXPECT_EQ(Names(dry->removed), (std::vector<std::string>{"blob:" + of_finished, "partial:" + stale_partial,
                                                           "job:" + old_done.id}));
  EXPECT_EQ(dry->referenced_blobs, 2u);
  EXPECT_TRUE(Exists(BlobPath(of_finished))) << "a dry run removes nothing";
  EXPECT_TRUE(Exists(old_done.job_dir));

  auto run = gc.Run(GcPolicy{}, /*dry_run=*/false);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(Names(run->removed), Names(dry->removed));
  EXPECT_TRUE(run->errors.empty());
  EXPECT_EQ(run->bytes_freed, 13u + 11u + 7u);  // the blob, the partial, the job's checkpoint
  EXPECT_FALSE(Exists(BlobPath(of_finished)));
  EXPECT_FALSE(Exists(dir_.path() + "/blobs/partial/" + stale_partial));
  EXPECT_FALSE(Exists(old_done.job_dir));
  EXPECT_EQ(ReadWholeFile(outside.path() + "/precious"), "user data");
  for (const std::string& kept : {in_spec, in_symlink, young}) EXPECT_TRUE(Exists(BlobPath(kept))) << kept;
  EXPECT_TRUE(Exists(queued.job_dir));
  EXPECT_TRUE(Exists(recent_done.job_dir));
  // The job's record stays (status and history still answer); only its folder went.
  EXPECT_TRUE(store_->GetJob(old_done.id).ok());
}

// In a running agent the collector reads the specs the supervisor parsed (daemon.cpp), never a text:
// not the text of a job it is given the spec of, nor of one it is given none of (in an agent, a job
// whose submit is still being recorded; its blobs are young).
TEST_F(Collector, ReadsOnlyTheTypedSpecsItIsGiven) {
  const std::string named = Blob("train data", 30 * kDay), unnamed = Blob("eval data", 30 * kDay);
  const std::string texted = Blob("only in a text", 30 * kDay);
  JobRecord queued = Job(JobState::QUEUED, CanonicalSpecJson(*SpecNaming(BlobPath(unnamed))), 0);
  JobRecord unknown = Job(JobState::QUEUED, CanonicalSpecJson(*SpecNaming(BlobPath(texted))), 0);
  std::set<std::string> asked;
  GarbageCollector gc(dir_.path(), store_.get(), blobs_.get(), [&](const std::string& id) {
    asked.insert(id);
    return id == queued.id ? SpecNaming(BlobPath(named)) : nullptr;
  });
  auto run = gc.Run(GcPolicy{}, false);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(asked, (std::set<std::string>{queued.id, unknown.id}));
  // The texts name `unnamed` and `texted`, the typed spec `named`: a collector that read a text would
  // keep one of them.
  std::vector<std::string> removed = Names(run->removed);
  std::sort(removed.begin(), removed.end());
  std::vector<std::string> expected = {"blob:" + texted, "blob:" + unnamed};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(removed, expected);
  EXPECT_TRUE(Exists(BlobPath(named)));
}

TEST_F(Collector, NeverRemovesABlobInUseOrAFolderOutsideTheJobsFolder) {
  const std::string uploading = Blob("resumed upl", 5 * kDay, /*partial=*/true);
  auto upload = blobs_->BeginUpload(uploading, 100, 11);  // a client resumes it right now
  ASSERT_TRUE(upload.ok()) << upload.status().ToString();
  Blob("resumed upl", 5 * kDay, /*partial=*/true);  // as if its last bytes came long ago
  // A damaged record whose folder is not <data_dir>/jobs/<id>.
  TempDir elsewhere;
  WriteAgedFile(elsewhere.path() + "/keep", "x");
  JobRecord rec = Job(JobState::SUCCEEDED, "{}", 40, elsewhere.path());

  GarbageCollector gc(dir_.path(), store_.get(), blobs_.get());
  auto run = gc.Run(GcPolicy{}, false);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(Names(run->removed), std::vector<std::string>{});
  ASSERT_EQ(run->errors.size(), 2u) << ::testing::PrintToString(run->errors);
  EXPECT_EQ(run->errors[0], "partial " + uploading + ": an upload of blob " + uploading + " is in progress");
  EXPECT_NE(run->errors[1].find("job " + rec.id + ": folder " + elsewhere.path() + " is not " + dir_.path() +
                                "/jobs/" + rec.id),
            std::string::npos)
      << run->errors[1];
  EXPECT_TRUE(Exists(dir_.path() + "/blobs/partial/" + uploading));
  EXPECT_TRUE(Exists(elsewhere.path() + "/keep"));
  upload->reset();  // the client goes away: the next run collects the stale partial
  EXPECT_EQ(Names(gc.Run(GcPolicy{}, false)->removed), (std::vector<std::string>{"partial:" + uploading}));
}

TEST_F(Collector, AskingAboutABlobCountsAsUsingIt) {
  const std::string sha = Blob("asked about", 30 * kDay);
  auto st = blobs_->StatBlob(sha);  // a client checks before it submits
  ASSERT_TRUE(st.ok() && st->complete);
  GarbageCollector gc(dir_.path(), store_.get(), blobs_.get());
  EXPECT_TRUE(gc.Run(GcPolicy{}, false)->removed.empty());
  EXPECT_TRUE(Exists(BlobPath(sha)));
}

TEST(GcRequest, OverridesTheDefaultsAndRefusesNegativeAges) {
  v1::CollectGarbageRequest req;
  req.set_blob_max_age_s(3600);
  req.set_job_max_age_s(-1);
  req.set_max_store_bytes(1 << 20);
  auto p = GcPolicyFromRequest(req, GcPolicy{});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->blob_max_age_s, 3600);
  EXPECT_EQ(p->partial_max_age_s, 2 * kDay);
  EXPECT_EQ(p->job_max_age_s, -1);
  EXPECT_EQ(p->max_store_bytes, 1u << 20);
  req.set_partial_max_age_s(-5);
  auto bad = GcPolicyFromRequest(req, GcPolicy{});
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument, "partial_max_age_s: must be positive"));
}

// `sftd gc` through a running agent, automatic collection above the store cap, and `sftd gc` with no
// agent running; a job that is running keeps its input throughout.
TEST(SftdGc, ThroughTheAgentAutomaticallyAndWithNoAgent) {
  TempDir dir;
  const std::string blobs = dir.path() + "/blobs/";
  std::string input = "the running job's input";
  std::string unused = "nobody's input anymore";
  {
    Agent a(dir.path());
    ASSERT_TRUE(a.Start());
    ASSERT_TRUE(UploadWhole(a, Sha256Hex(input), input).ok());
    ASSERT_TRUE(UploadWhole(a, Sha256Hex(unused), unused).ok());
    v1::SubmitJobRequest req;
    req.set_spec_json(StubSpec({{"steps", 100000}, {"step_ms", 50}}).dump());
    auto* ref = req.add_blobs();
    ref->set_json_pointer("/data/train/0");
    ref->set_sha256(Sha256Hex(input));
    v1::Job job;
    ASSERT_TRUE(a.stub()->SubmitJob(a.Ctx().get(), req, &job).ok());
    a.WaitState(job.id(), v1::RUNNING);
    WriteAgedFile(blobs + Sha256Hex(input), input, 30 * kDay);  // both look long unused
    WriteAgedFile(blobs + Sha256Hex(unused), unused, 30 * kDay);

    auto [rc, out] = RunForStdout({SftdPath(), "gc", "--data-dir", dir.path(), "--dry-run"});
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("would remove blob " + Sha256Hex(unused) + " (22 bytes): unused for 30 days"),
              std::string::npos)
        << out;
    EXPECT_EQ(out.find(Sha256Hex(input)), std::string::npos) << out;
    EXPECT_TRUE(Exists(blobs + Sha256Hex(unused)));
    const CommandResult json = RunForStdout({SftdPath(), "gc", "--data-dir", dir.path(), "--json"});
    EXPECT_EQ(json.exit_code, 0) << json.output;
    auto j = nlohmann::json::parse(json.output, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << json.output;
    EXPECT_EQ(j["bytesFreed"], "22");
    EXPECT_EQ(j["referencedBlobs"], 1);
    EXPECT_FALSE(Exists(blobs + Sha256Hex(unused)));
    EXPECT_TRUE(Exists(blobs + Sha256Hex(input)));
    v1::CancelJobRequest cancel;
    cancel.set_job_id(job.id());
    v1::Job cancelled;
    EXPECT_TRUE(a.stub()->CancelJob(a.Ctx().get(), cancel, &cancelled).ok());
    a.WaitState(job.id(), v1::CANCELLED);
  }
  // Automatic: a store over its cap sheds what no job needs, and nothing used just now.
  std::string fresh = "uploaded a moment ago";
  WriteAgedFile(blobs + Sha256Hex(unused), unused, 30 * kDay);
  WriteAgedFile(blobs + Sha256Hex(fresh), fresh);
  {
    Agent a(dir.path());
    ASSERT_TRUE(a.Start({"--gc-max-store-bytes", "1", "--gc-check", "1s"}));
    EXPECT_TRUE(WaitFor([&] { return !Exists(blobs + Sha256Hex(unused)); }));
    EXPECT_FALSE(Exists(blobs + Sha256Hex(input))) << "its job was cancelled, so it is spare";
    EXPECT_TRUE(Exists(blobs + Sha256Hex(fresh)));
  }
  // No agent: `sftd gc` collects under the data dir's lock.
  WriteAgedFile(blobs + Sha256Hex(fresh), fresh, 10 * kDay);
  auto [rc, out] = RunForStdout({SftdPath(), "gc", "--data-dir", dir.path()});
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("removed blob " + Sha256Hex(fresh)), std::string::npos) << out;
  EXPECT_FALSE(Exists(blobs + Sha256Hex(fresh)));
  // A negative age is refused while the flags are parsed (common/duration.h), before any collection.
  const CommandResult bad = RunCommand({SftdPath(), "gc", "--data-dir", dir.path(), "--blob-max-age=-3d"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--blob-max-age: '-3d' is not a duration (must not be negative"),
            std::string::npos)
      << bad.output;
}

}  // namespace
}  // namespace sftctl::agent::testing
