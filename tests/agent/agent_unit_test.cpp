// Unit tests of the agent's components (no gRPC server, no processes except where noted).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "agent/jobs/gpu_discovery.h"
#include "agent/jobs/scheduler.h"
#include "agent/serving/auth.h"
#include "agent/serving/daemon.h"
#include "agent/state/artifacts.h"
#include "agent/state/blob_store.h"
#include "agent/state/job_spec.h"
#include "agent/state/journal.h"
#include "agent/state/state_store.h"
#include "common/checkpoint_name.h"
#include "common/os/file_system.h"
#include "common/os/process_util.h"
#include "common/sha256.h"
#include "tests/util/file_util.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"

namespace sftctl::agent {
namespace {
namespace v1 = ::sftctl::v1;
using ::sftctl::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

using ::sftctl::testing::TempDir;

// A disk that fills up: appends to files opened with NewAppendableFile succeed while `space` bytes
// last; the append that crosses the limit writes what still fits (a half-written record) and fails
// with ENOSPC. Truncating gives no space back (SetSpace "frees" it), and can be made to fail (EIO).
class DiskFullFileSystem : public ForwardingFileSystem {
 public:
  DiskFullFileSystem() : ForwardingFileSystem(FileSystem::Default()) {}
  void SetSpace(uint64_t bytes) { space_ = bytes; }
  void FailTruncate(bool fail) { fail_truncate_ = fail; }

  StatusOr<std::unique_ptr<AppendableFile>> NewAppendableFile(const std::string& path) override {
    SFT_ASSIGN_OR_RETURN(std::unique_ptr<AppendableFile> f, base()->NewAppendableFile(path));
    return std::unique_ptr<AppendableFile>(new File(this, std::move(f), path));
  }

 private:
  class File : public AppendableFile {
   public:
    File(DiskFullFileSystem* fs, std::unique_ptr<AppendableFile> f, std::string path)
        : fs_(fs), f_(std::move(f)), path_(std::move(path)) {}
    Status Append(std::string_view data) override {
      const size_t fits = static_cast<size_t>(std::min<uint64_t>(data.size(), fs_->space_));
      SFT_RETURN_IF_ERROR(f_->Append(data.substr(0, fits)));
      fs_->space_ -= fits;
      if (fits < data.size()) return ErrnoError("cannot write", path_, ENOSPC);
      return OkStatus();
    }
    Status Truncate(uint64_t size) override {
      if (fs_->fail_truncate_) return ErrnoError("cannot truncate", path_, EIO);
      return f_->Truncate(size);
    }
    Status Sync() override { return f_->Sync(); }
    Status Close() override { return f_->Close(); }
    StatusOr<size_t> ReadAt(uint64_t offset, size_t n, char* scratch) override {
      return f_->ReadAt(offset, n, scratch);
    }
    StatusOr<uint64_t> Size() override { return f_->Size(); }

   private:
    DiskFullFileSystem* fs_;
    std::unique_ptr<AppendableFile> f_;
    std::string path_;
  };

  uint64_t space_ = UINT64_MAX;
  bool fail_truncate_ = false;
};

JournalEvent Line(const std::string& text, int rank = 0) {
  JournalEvent e;
  e.kind = v1::Event::STDOUT;
  e.rank = rank;
  e.text = text;
  return e;
}

// Issue 37, item 4: the one reader of trainer event lines (the supervisor, its recovery and the Slurm
// follow thread). A field of the wrong type ({"event":7} threw type_error.302 and stopped the agent) is
// INVALID_ARGUMENT naming the rank and the field, never an exception.
TEST(TrainerEvent, ReadsTheTrainersEventsAndRefusesFieldsOfTheWrongType) {
  auto step = ParseTrainerEvent(R"({"event":"step","step":7,"loss":0.25,"lr":1e-4})", 0);
  ASSERT_TRUE(step.ok()) << step.status().message();
  EXPECT_EQ(step->kind, "step");
  EXPECT_EQ(step->step, 7);
  EXPECT_EQ(step->loss, 0.25);
  auto nan_loss = ParseTrainerEvent(R"({"event":"step","step":8,"loss":null})", 0);
  ASSERT_TRUE(nan_loss.ok());
  EXPECT_FALSE(nan_loss->loss.has_value());
  auto error = ParseTrainerEvent(R"({"event":"error","message":"CUDA out of memory"})", 1);
  ASSERT_TRUE(error.ok());
  EXPECT_EQ(error->message, "CUDA out of memory");
  EXPECT_THAT(
      ParseTrainerEvent(R"({"event":7,"step":1})", 2),
      StatusIs(StatusCode::kInvalidArgument, "rank 2 event: field 'event': expected a string, got number 7"));
  EXPECT_THAT(
      ParseTrainerEvent(R"({"event":"step","step":"one"})", 0),
      StatusIs(StatusCode::kInvalidArgument, "rank 0 event: field 'step': expected an integer, got string"));
  EXPECT_THAT(
      ParseTrainerEvent(R"({"step":1})", 0),
      StatusIs(StatusCode::kInvalidArgument, "rank 0 event: field 'event': missing (expected a string)"));
  EXPECT_THAT(ParseTrainerEvent("step 3 of 10", 0),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("rank 0 event: invalid JSON")));
}

TEST(Journal, AppendsNumberedEventsAndReplaysFromRingAndFile) {
  TempDir d;
  auto j = Journal::Open(d.path() + "/j.jsonl");
  ASSERT_TRUE(j.ok());
  const uint64_t n = Journal::kRingSize * 2 + 77;  // older events must come from the file
  std::vector<JournalEvent> batch;
  for (uint64_t i = 1; i <= n; ++i) batch.push_back(Line("line " + std::to_string(i)));
  ASSERT_EQ(*(*j)->Append(batch), n);
  for (uint64_t after :
       {uint64_t{0}, uint64_t{1}, uint64_t{255}, uint64_t{256}, uint64_t{257}, n - 10, n - 1}) {
    auto r = (*j)->Read(after, 100);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->size(), std::min<uint64_t>(100, n - after)) << after;
    for (size_t i = 0; i < r->size(); ++i) {
      EXPECT_EQ((*r)[i].seq, after + 1 + i);
      EXPECT_EQ((*r)[i].text, "line " + std::to_string(after + 1 + i));
    }
  }
  EXPECT_TRUE((*j)->Read(n, 10)->empty());
}

// A full disk (here: RLIMIT_FSIZE, which fails the write with EFBIG after a few bytes) must not
// leave the file and memory disagreeing: the failed batch leaves no trace and the next one
// continues the numbering, also after a reopen.
TEST(Journal, AFailedAppendLeavesFileAndMemoryUnchanged) {
  TempDir d;
  const std::string path = d.path() + "/j.jsonl";
  auto j = Journal::Open(path);
  ASSERT_TRUE(j.ok());
  ASSERT_EQ(*(*j)->Append({Line("one"), Line("two")}), 2u);
  const auto size_before = std::filesystem::file_size(path);

  ::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit tight = old;
  tight.rlim_cur = size_before + 10;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &tight), 0);
  auto failed = (*j)->Append({Line(std::string(1000, 'x')), Line("four")});
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(std::filesystem::file_size(path), size_before);
  EXPECT_EQ((*j)->last_seq(), 2u);
  EXPECT_EQ((*j)->Read(0, 10)->size(), 2u);

  ASSERT_EQ(*(*j)->Append({Line("three")}), 3u);
  j->reset();
  auto again = Journal::Open(path);
  ASSERT_TRUE(again.ok());
  auto all = (*again)->Read(0, 10);
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[2].text, "three");
  EXPECT_EQ((*all)[2].seq, 3u);
}

std::vector<std::string> TextsOf(const std::vector<JournalEvent>& events) {
  std::vector<std::string> out;
  for (const JournalEvent& e : events) out.push_back(std::to_string(e.seq) + ":" + e.text);
  return out;
}

// A journal on a disk that fills up (DiskFullFileSystem).
class DiskFullJournal : public ::testing::Test {
 protected:
  // Plain names: the tests read like the scenario they describe.
  void SetUp() override { ASSERT_TRUE(j.ok()) << j.status().ToString(); }

  TempDir dir;
  const std::string path = dir.path() + "/j.jsonl";
  DiskFullFileSystem fs;
  StatusOr<std::shared_ptr<Journal>> j = Journal::Open(path, &fs);
};

// The disk fills up in the middle of a record and the agent dies before it can cut the half-written
// record off: the Append fails with the disk's error, and a reopen reads back exactly the events
// acknowledged before it.
TEST_F(DiskFullJournal, AnAppendFailsAndAReopenReadsBackExactlyTheAcknowledgedEvents) {
  ASSERT_EQ(*(*j)->Append({Line("one")}), 1u);
  ASSERT_EQ(*(*j)->Append({Line("two")}), 2u);
  const auto size_before = std::filesystem::file_size(path);

  fs.SetSpace(10);
  fs.FailTruncate(true);
  EXPECT_THAT((*j)->Append({Line("three"), Line("four")}),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("No space left on device")));
  EXPECT_EQ((*j)->last_seq(), 2u);
  EXPECT_EQ(std::filesystem::file_size(path), size_before + 10);  // the half-written record
  j->reset();

  auto again = Journal::Open(path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->last_seq(), 2u);
  auto all = (*again)->Read(0, 10);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(TextsOf(*all), (std::vector<std::string>{"1:one", "2:two"}));
  EXPECT_EQ(std::filesystem::file_size(path), size_before);
}

// A half-written record that could not be cut off at once is cut off before the next Append, so the
// events appended after it are not buried behind a torn line (which a reopen would drop).
TEST_F(DiskFullJournal, AHalfWrittenRecordIsCutOffBeforeTheNextAppend) {
  ASSERT_EQ(*(*j)->Append({Line("one")}), 1u);
  fs.SetSpace(10);
  EXPECT_THAT((*j)->Append({Line("two")}),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("No space left on device")));
  const auto size_cut = std::filesystem::file_size(path);  // cut at once: only "one" is left
  fs.FailTruncate(true);
  fs.SetSpace(10);
  EXPECT_THAT((*j)->Append({Line("two")}),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("cannot undo a failed journal write")));
  fs.SetSpace(UINT64_MAX);  // space freed, but the torn record is still there
  EXPECT_THAT((*j)->Append({Line("two")}),
              StatusIs(StatusCode::kInternal, HasSubstr("still holds the rest of a failed write")));
  fs.FailTruncate(false);
  ASSERT_EQ(*(*j)->Append({Line("two")}), 2u);
  EXPECT_GT(std::filesystem::file_size(path), size_cut);
  EXPECT_EQ(TextsOf(*(*j)->Read(0, 10)), (std::vector<std::string>{"1:one", "2:two"}));
  j->reset();

  auto again = Journal::Open(path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(TextsOf(*(*again)->Read(0, 10)), (std::vector<std::string>{"1:one", "2:two"}));
}

// Long lines do not grow the in-memory ring without bound; older events come from the file.
TEST(Journal, TheRingIsBoundedByBytesAndOlderEventsComeFromTheFile) {
  TempDir d;
  auto j = Journal::Open(d.path() + "/j.jsonl");
  ASSERT_TRUE(j.ok());
  const std::string mib(1 << 20, 'y');
  for (int i = 0; i < 24; ++i) ASSERT_TRUE((*j)->Append({Line(std::to_string(i) + mib)}).ok());
  EXPECT_LE((*j)->ring_bytes(), Journal::kRingBytes + mib.size() + 8);
  EXPECT_GE((*j)->ring_bytes(), Journal::kRingBytes - mib.size());
  auto all = (*j)->Read(0, 100);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 24u);
  for (int i = 0; i < 24; ++i) EXPECT_EQ((*all)[i].text.substr(0, 2), (std::to_string(i) + "y").substr(0, 2));
}

TEST(Journal, ReopenRebuildsStateAndTruncatesTornTail) {
  TempDir d;
  std::string path = d.path() + "/j.jsonl";
  {
    auto j = Journal::Open(path);
    JournalEvent e = Line("a\tb \"quoted\" \xff invalid utf8");
    e.src = 0;
    e.src_end = 42;
    ASSERT_TRUE((*j)->Append({e, Line("second")}).ok());
  }
  std::ofstream(path, std::ios::app) << "{\"seq\":3,\"t\":1,\"k\":1,\"r\":0,\"x\":\"torn";  // died mid-write
  auto j = Journal::Open(path);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ((*j)->last_seq(), 2u);
  EXPECT_EQ(((*j)->source_offsets()[{0, 0}]), 42u);
  ASSERT_EQ(*(*j)->Append({Line("third")}), 3u);
  auto r = (*j)->Read(0, 10);
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[2].text, "third");
  EXPECT_EQ((*r)[0].text.substr(0, 3), "a\tb");
}

TEST(Journal, FollowersAreNotifiedOnAppendAndFinish) {
  TempDir d;
  auto j = *Journal::Open(d.path() + "/j.jsonl");
  int fired = 0;
  j->NotifyWhenAfter(0, [&] { ++fired; });
  EXPECT_EQ(fired, 0);
  ASSERT_TRUE(j->Append({Line("x")}).ok());
  EXPECT_EQ(fired, 1);
  j->NotifyWhenAfter(0, [&] { ++fired; });  // already satisfied: fires at once
  EXPECT_EQ(fired, 2);
  j->NotifyWhenAfter(1, [&] { ++fired; });
  j->SetFinished(true);
  EXPECT_EQ(fired, 3);
}

TEST(StateStore, JobsRanksHistoryRoundTrip) {
  TempDir d;
  auto store = StateStore::Open(d.path() + "/agent.db");
  ASSERT_TRUE(store.ok());
  JobRecord rec;
  rec.name = "n";
  rec.client_request_id = "abc";
  rec.gpus = 2;
  rec.world_size = 2;
  rec.job_dir = d.path() + "/jobs/";
  rec.created_ms = 5;
  auto ins = (*store)->InsertJob(rec);
  ASSERT_TRUE(ins.ok());
  EXPECT_EQ(ins->id, "job-1");
  EXPECT_EQ(ins->job_dir, d.path() + "/jobs/job-1");
  JobRecord r = *ins;
  r.state = JobState::RUNNING;
  r.assigned_gpus = {0, 3};
  r.ranks = {{0, 100, 7, true, RankExit()}, {1, 101, 8, false, RankExit{true, 0, 9}}};
  HistoryRecord h{JobState::RUNNING, "launched", 9};
  ASSERT_TRUE((*store)->SaveJob(r, &h).ok());
  auto got = (*store)->GetJob("job-1");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->state, JobState::RUNNING);
  EXPECT_EQ(got->assigned_gpus, (std::vector<int>{0, 3}));
  ASSERT_EQ(got->ranks.size(), 2u);
  EXPECT_EQ(got->ranks[1].exit.signal, 9);
  EXPECT_TRUE(got->ranks[1].exit.known);
  EXPECT_FALSE(got->ranks[0].exit.known);
  EXPECT_FALSE(got->ranks[1].running);
  EXPECT_EQ(got->ranks[0].start_time, 7u);
  auto hist = (*store)->History("job-1");
  ASSERT_EQ(hist->size(), 2u);
  EXPECT_EQ((*hist)[1].reason, "launched");
  EXPECT_EQ(*(*(*store)->FindByRequestId("abc")), "job-1");
  EXPECT_EQ((*store)->GetJob("job-2").status().code(), StatusCode::kNotFound);
}

// A full disk (RLIMIT_FSIZE) while saving: the save fails with an error, the job keeps its last
// committed state, and once there is room again the store works (no transaction was left open).
TEST(StateStore, AFullDiskFailsTheSaveAndLosesNothingCommitted) {
  TempDir d;
  const std::string db = d.path() + "/agent.db";
  auto store = StateStore::Open(db);
  ASSERT_TRUE(store.ok());
  JobRecord rec;
  rec.name = "n";
  rec.job_dir = d.path() + "/jobs/";
  auto ins = (*store)->InsertJob(rec);
  ASSERT_TRUE(ins.ok());
  JobRecord running = *ins;
  running.state = JobState::RUNNING;
  HistoryRecord launched{JobState::RUNNING, "launched", 9};
  ASSERT_TRUE((*store)->SaveJob(running, &launched).ok());

  ::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit tight = old;
  tight.rlim_cur = std::filesystem::file_size(db) + 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &tight), 0);
  JobRecord big = running;
  big.state = JobState::SUCCEEDED;
  big.spec_json = std::string(4 << 20, 'x');  // more pages than the limit lets SQLite write
  HistoryRecord done{JobState::SUCCEEDED, "done", 10};
  Status full = (*store)->SaveJob(big, &done);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  EXPECT_THAT(full, StatusIs(StatusCode::kInternal, HasSubstr("sqlite")));

  auto got = (*store)->GetJob(ins->id);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->state, JobState::RUNNING);
  EXPECT_EQ((*store)->History(ins->id)->size(), 2u);
  big.spec_json = "{}";
  ASSERT_TRUE((*store)->SaveJob(big, &done).ok());
  store->reset();
  auto reopened = StateStore::Open(db);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->GetJob(ins->id)->state, JobState::SUCCEEDED);
  EXPECT_EQ((*reopened)->History(ins->id)->size(), 3u);
}

TEST(StateStore, RendezvousAndFirstFailedRankPersist) {
  TempDir d;
  auto store = StateStore::Open(d.path() + "/agent.db");
  ASSERT_TRUE(store.ok());
  JobRecord rec;
  rec.job_dir = d.path() + "/jobs/";
  rec.rendezvous.set_num_nodes(2);
  rec.rendezvous.set_node_rank(1);
  rec.rendezvous.set_world_size(4);
  rec.rendezvous.set_rank_offset(2);
  rec.rendezvous.set_master_addr("10.0.0.5");
  rec.rendezvous.set_master_port(29501);
  rec.rendezvous.set_group_id("grp");
  auto ins = (*store)->InsertJob(rec);
  ASSERT_TRUE(ins.ok());
  auto got = (*store)->GetJob(ins->id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->rendezvous.SerializeAsString(), rec.rendezvous.SerializeAsString());
  EXPECT_EQ(got->first_failed_rank, -1);
  got->first_failed_rank = 3;
  ASSERT_TRUE((*store)->SaveJob(*got, nullptr).ok());
  store->reset();
  auto reopened = StateStore::Open(d.path() + "/agent.db");
  ASSERT_TRUE(reopened.ok());
  auto again = (*reopened)->GetJob(ins->id);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->first_failed_rank, 3);
  EXPECT_EQ(again->rendezvous.master_port(), 29501u);
  EXPECT_TRUE(IsMultiNode(*again));
}

TEST(StateStore, DatabaseOfAnOlderAgentGainsTheNewColumns) {
  TempDir d;
  const std::string db_path = d.path() + "/agent.db";
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(db_path.c_str(), &db), SQLITE_OK);
  // The jobs table as the first release created it, with one job.
  const char* old_schema =
      "CREATE TABLE jobs (num INTEGER PRIMARY KEY, id TEXT UNIQUE NOT NULL, name TEXT NOT NULL DEFAULT '', "
      "client_request_id TEXT, state INTEGER NOT NULL, reason TEXT NOT NULL DEFAULT '', gpus INTEGER NOT "
      "NULL, world_size INTEGER NOT NULL, assigned_gpus TEXT NOT NULL DEFAULT '', restarts INTEGER NOT NULL "
      "DEFAULT 0, max_restarts INTEGER NOT NULL DEFAULT 0, heartbeat_s INTEGER NOT NULL DEFAULT 0, "
      "created_ms INTEGER NOT NULL, started_ms INTEGER NOT NULL DEFAULT 0, finished_ms INTEGER NOT NULL "
      "DEFAULT 0, last_step INTEGER NOT NULL DEFAULT -1, last_loss REAL NOT NULL DEFAULT 0, pgid INTEGER NOT "
      "NULL DEFAULT 0, job_dir TEXT NOT NULL, spec_json TEXT NOT NULL);"
      "INSERT INTO jobs (num, id, state, gpus, world_size, created_ms, job_dir, spec_json) "
      "VALUES (1, 'job-1', 4, 0, 1, 5, '/j', '{}');";
  ASSERT_EQ(sqlite3_exec(db, old_schema, nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto store = StateStore::Open(db_path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto got = (*store)->GetJob("job-1");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->first_failed_rank, -1);
  EXPECT_FALSE(IsMultiNode(*got));
  got->first_failed_rank = 0;
  EXPECT_TRUE((*store)->SaveJob(*got, nullptr).ok());
}

// Issue 37, item 4: a column damaged on disk (not the JSON or the list the agent writes) threw while the
// jobs were read back, so the agent could not start. Now the record comes back with `corrupt` naming the
// column and the field; the other jobs read normally.
TEST(StateStore, ADamagedColumnIsNotedOnItsRecordNotThrown) {
  TempDir d;
  const std::string db_path = d.path() + "/agent.db";
  {
    auto store = StateStore::Open(db_path);
    ASSERT_TRUE(store.ok());
    for (int i = 0; i < 4; ++i) {
      JobRecord rec;
      rec.job_dir = d.path() + "/jobs/";
      ASSERT_TRUE((*store)->InsertJob(rec).ok());
    }
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(db_path.c_str(), &db), SQLITE_OK);
  const char* damage =
      "UPDATE jobs SET rendezvous='{\"num_nodes\":2,\"master_port\":\"x\"}' WHERE id='job-1';"
      "UPDATE jobs SET assigned_gpus='0,gpu1' WHERE id='job-2';"
      "UPDATE jobs SET slurm='{\"job_id\":17}' WHERE id='job-3';";
  ASSERT_EQ(sqlite3_exec(db, damage, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  sqlite3_close(db);
  auto store = StateStore::Open(db_path);
  ASSERT_TRUE(store.ok());
  auto jobs = (*store)->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status().ToString();
  ASSERT_EQ(jobs->size(), 4u);
  EXPECT_EQ((*jobs)[0].corrupt, "rendezvous: field 'master_port': expected an integer >= 0, got string");
  EXPECT_EQ((*jobs)[1].corrupt, "assigned_gpus: 'gpu1' is not a GPU index");
  EXPECT_EQ((*jobs)[2].corrupt, "slurm: field 'job_id': expected a string, got number 17");
  EXPECT_EQ((*jobs)[3].corrupt, "");
}

TEST(BlobStore, MismatchStoresNothingResumeCompletes) {
  TempDir d;
  auto store = StateStore::Open(d.path() + "/agent.db").value();
  BlobStore blobs(d.path() + "/blobs", store.get());
  ASSERT_TRUE(blobs.Init().ok());
  std::string data = "hello blob world";
  std::string sha = Sha256Hex(data);
  {
    auto up = blobs.BeginUpload(sha, data.size(), 0);
    ASSERT_TRUE(up.ok());
    ASSERT_TRUE((*up)->Write("HELLO blob world").ok());
    Status s = (*up)->Finish();
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  }
  EXPECT_EQ(blobs.StatBlob(sha)->size, 0u);
  EXPECT_FALSE(std::filesystem::exists(blobs.BlobPath(sha)));
  {
    auto up = blobs.BeginUpload(sha, data.size(), 0).value();
    ASSERT_TRUE(up->Write(data.substr(0, 5)).ok());
    EXPECT_EQ(blobs.BeginUpload(sha, data.size(), 0).status().code(), StatusCode::kAborted);
  }  // client went away
  EXPECT_EQ(blobs.StatBlob(sha)->size, 5u);
  EXPECT_EQ(blobs.BeginUpload(sha, data.size(), 0).status().code(), StatusCode::kFailedPrecondition);
  auto up = blobs.BeginUpload(sha, data.size(), 5).value();
  EXPECT_EQ(up->Write(data.substr(5) + "x").code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(up->Write(data.substr(5)).ok());
  ASSERT_TRUE(up->Finish().ok());
  EXPECT_TRUE(blobs.StatBlob(sha)->complete);
  EXPECT_EQ(blobs.BeginUpload(sha, data.size(), 0).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(blobs.StatBlob("xyz").status().code(), StatusCode::kInvalidArgument);
}

// A blob store on a disk that fills up (DiskFullFileSystem), and a 3000-byte blob to upload.
class DiskFullBlobStore : public ::testing::Test {
 protected:
  // Plain names: the tests read like the scenario they describe.
  void SetUp() override {
    ASSERT_TRUE(blobs.Init().ok());
    for (int i = 0; i < 3000; ++i) data.push_back(static_cast<char>('a' + i % 26));
    sha = Sha256Hex(data);
  }

  TempDir dir;
  std::unique_ptr<StateStore> store = StateStore::Open(dir.path() + "/agent.db").value();
  DiskFullFileSystem fs;
  BlobStore blobs{dir.path() + "/blobs", store.get(), &fs};
  std::string data, sha;
};

// The disk fills up in the middle of a chunk: the write fails with the disk's error, the half-written
// chunk is cut off the partial file, the blob is not complete, and once space is freed the same upload
// completes with exactly the declared bytes.
TEST_F(DiskFullBlobStore, AWriteFailsAndTheUploadCompletesOnceSpaceIsFreed) {
  auto up = blobs.BeginUpload(sha, data.size(), 0).value();
  ASSERT_TRUE(up->Write(data.substr(0, 1000)).ok());
  fs.SetSpace(500);
  EXPECT_THAT(up->Write(data.substr(1000, 1000)),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("No space left on device")));
  EXPECT_EQ(up->written(), 1000u);
  EXPECT_THAT(up->Finish(), StatusIs(StatusCode::kDataLoss, HasSubstr("received 1000 of 3000 bytes")));
  EXPECT_FALSE(blobs.StatBlob(sha)->complete);
  EXPECT_EQ(blobs.StatBlob(sha)->size, 1000u);

  fs.SetSpace(UINT64_MAX);
  ASSERT_TRUE(up->Write(data.substr(1000)).ok());
  ASSERT_TRUE(up->Finish().ok());
  EXPECT_TRUE(blobs.StatBlob(sha)->complete);
  EXPECT_EQ(blobs.StatBlob(sha)->size, data.size());
  EXPECT_EQ(*Sha256File(blobs.BlobPath(sha)), sha);
}

// When the half-written chunk cannot be cut off, the upload ends; a new one resumes from the bytes
// the agent holds, and the blob, hashed by reading the partial file back, completes.
TEST_F(DiskFullBlobStore, AnUploadItEndsResumesFromTheBytesHeld) {
  {
    auto up = blobs.BeginUpload(sha, data.size(), 0).value();
    ASSERT_TRUE(up->Write(data.substr(0, 1000)).ok());
    fs.SetSpace(500);
    fs.FailTruncate(true);
    EXPECT_THAT(up->Write(data.substr(1000, 1000)),
                StatusIs(StatusCode::kResourceExhausted, HasSubstr("the upload ends")));
    EXPECT_THAT(up->Write(data.substr(1000, 1000)),
                StatusIs(StatusCode::kFailedPrecondition, HasSubstr("already finished")));
  }
  fs.FailTruncate(false);
  fs.SetSpace(UINT64_MAX);
  auto held = blobs.StatBlob(sha);
  ASSERT_TRUE(held.ok());
  EXPECT_FALSE(held->complete);
  EXPECT_EQ(held->size, 1500u);  // what reached the disk: a prefix of the blob
  auto up = blobs.BeginUpload(sha, data.size(), held->size).value();
  ASSERT_TRUE(up->Write(data.substr(held->size)).ok());
  ASSERT_TRUE(up->Finish().ok());
  EXPECT_TRUE(blobs.StatBlob(sha)->complete);
  EXPECT_EQ(*Sha256File(blobs.BlobPath(sha)), sha);
}

TEST(Scheduler, FifoWithGpuAllocationAndQueueing) {
  Scheduler s({0, 1, 2}, 2);
  EXPECT_EQ(s.CheckFits(4, 0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.CheckFits(0, 3).code(), StatusCode::kFailedPrecondition);
  s.Enqueue("a", 2, 0);
  s.Enqueue("b", 2, 0);
  s.Enqueue("c", 1, 0);  // would fit, but must not overtake b
  s.Enqueue("cpu", 0, 2);
  auto got = s.Admit();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].job_id, "a");
  EXPECT_EQ(got[0].gpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(got[1].job_id, "cpu");
  EXPECT_EQ(s.queued(), 2u);
  s.Release("a");  // 3 GPUs free again: b (2) and then c (1) fit
  got = s.Admit();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].job_id, "b");
  EXPECT_EQ(got[1].job_id, "c");
  EXPECT_EQ(got[1].gpus, (std::vector<int>{2}));
  EXPECT_EQ(s.gpus_free(), 0u);
  EXPECT_FALSE(s.Dequeue("c"));
  s.Enqueue("d", 1, 0);
  EXPECT_TRUE(s.Dequeue("d"));
}

TEST(GpuDiscovery, ParsesOverridesAndNvidiaSmi) {
  EXPECT_TRUE(ParseGpuList("none")->empty());
  EXPECT_TRUE(ParseGpuList("")->empty());
  EXPECT_EQ(ParseGpuList("0, 2")->at(1).index, 2);
  EXPECT_EQ(ParseGpuList("0,x").status().message(), "gpus: bad GPU index 'x'");
  EXPECT_EQ(ParseGpuList("1,1").status().code(), StatusCode::kInvalidArgument);
  auto smi = ParseNvidiaSmi("0, NVIDIA H100 80GB HBM3, 81559\n1, NVIDIA H100 80GB HBM3, 81559\n");
  ASSERT_TRUE(smi.ok());
  ASSERT_EQ(smi->size(), 2u);
  EXPECT_EQ(smi->at(1).name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(smi->at(0).memory_mib, 81559u);
}

TEST(Artifacts, ResolveInsideRejectsEscapes) {
  TempDir d;
  std::string root = d.path() + "/job";
  std::filesystem::create_directories(root + "/run/sub");
  std::ofstream(root + "/run/sub/f.txt") << "x";
  std::ofstream(d.path() + "/outside") << "y";
  std::filesystem::create_symlink(d.path() + "/outside", root + "/run/link");
  EXPECT_TRUE(ResolveInside(root, "run/sub/f.txt").ok());
  EXPECT_EQ(ResolveInside(root, "").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveInside(root, "/etc/passwd").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveInside(root, "run/../../outside").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveInside(root, "..").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveInside(root, "run/link").status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(ResolveInside(root, "run/nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ResolveInside(root, "run/sub").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ResolveInside(root, "run/sub/..f.txt").status().code() == StatusCode::kNotFound);
  EXPECT_EQ(CheckpointStep("checkpoint-000012"), 12);
  EXPECT_EQ(CheckpointStep("checkpoint-"), -1);
  EXPECT_EQ(CheckpointStep("checkpoint-1a"), -1);
}

TEST(Artifacts, HashesAreCachedUntilTheFileChanges) {
  TempDir d;
  auto store = StateStore::Open(d.path() + "/agent.db").value();
  Artifacts arts(store.get());
  std::string job = d.path() + "/job";
  std::filesystem::create_directories(job + "/run/checkpoint-000002");
  std::ofstream(job + "/run/checkpoint-000002/model.bin") << "weights";
  std::ofstream(job + "/run/checkpoint-000002/DONE") << "";
  auto list = arts.List("job-1", job);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ(list->at(1).path, "run/checkpoint-000002/model.bin");
  EXPECT_EQ(list->at(1).sha256, Sha256Hex("weights"));
  EXPECT_EQ(list->at(1).checkpoint_step, 2);
  EXPECT_TRUE(list->at(1).checkpoint_complete);
  struct stat st;
  ::stat((job + "/run/checkpoint-000002/model.bin").c_str(), &st);
  int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
  EXPECT_EQ(*store->CachedHash("job-1", "run/checkpoint-000002/model.bin", 7, mtime), Sha256Hex("weights"));
}

TEST(JobSpec, ValidatesAndRewrites) {
  auto path_of = [](const std::string& sha) -> StatusOr<std::string> { return "/blobs/" + sha; };
  std::string sha = Sha256Hex("d");
  auto spec = ValidateSpec(R"({"model": {"config": {}}, "data": {"train": "local.jsonl"}})",
                           {{"/data/train", sha, ""}}, path_of);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->data.train, std::vector<std::string>{"/blobs/" + sha});
  EXPECT_EQ(ValidateSpec("3", {}, path_of).status().message(), "spec_json: not a JSON object");
  EXPECT_EQ(ValidateSpec(R"({"data": {"train": 3}})", {{"/data/train", sha, ""}}, path_of).status().message(),
            "blobs[0].json_pointer: spec_json/data/train must be a string (a file reference)");
  EXPECT_EQ(ValidateSpec("{}", {{"/a", "nothex", ""}}, path_of).status().message(),
            "blobs[0].sha256: must be 64 lowercase hex digits");
  // The spec itself is checked as the trainer checks it (common/spec/spec.h).
  EXPECT_THAT(ValidateSpec(R"({"model": {"config": {}}, "data": {"train": ["a"]}, "lr": 1})", {}, path_of),
              StatusIs(StatusCode::kInvalidArgument, StartsWith("spec_json: field 'lr': unknown field")));
  EXPECT_THAT(ValidateSpec(R"({"data": {"train": ["a"]}})", {}, path_of),
              StatusIs(StatusCode::kInvalidArgument, StartsWith("spec_json: field 'model': is required")));
}

TEST(JobSpec, RewritesListElementsButNeverAppends) {
  // data.train is a list in sftctl specs: each element can be a blob reference.
  auto path_of = [](const std::string& sha) -> StatusOr<std::string> { return "/blobs/" + sha; };
  const std::string a = Sha256Hex("a"), b = Sha256Hex("b");
  auto spec = ValidateSpec(R"({"model": {"config": {}}, "data": {"train": ["x.jsonl", "y.jsonl"]}})",
                           {{"/data/train/0", a, ""}, {"/data/train/1", b, ""}}, path_of);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->data.train, (std::vector<std::string>{"/blobs/" + a, "/blobs/" + b}));
  for (const char* ptr : {"/data/train/2", "/data/train/-", "/data/nothing/0"}) {
    auto bad = ValidateSpec(R"({"data": {"train": ["x.jsonl"]}})", {{ptr, a, ""}}, path_of);
    ASSERT_FALSE(bad.ok()) << ptr;
    EXPECT_EQ(bad.status().message(),
              std::string("blobs[0].json_pointer: '") + ptr +
                  "' names neither a field of an object nor an existing list element in "
                  "spec_json");
  }
}

TEST(JobSpec, SpecStringAtNamesTheStringsOfTheCanonicalJson) {
  JobSpec spec;
  spec.data.train = {"a.jsonl", "b.jsonl"};
  spec.model.config = {{"x", {{"y", "z"}}}, {"n", 1}};
  EXPECT_EQ(SpecStringAt(&spec, "/model/path"), &spec.model.path);
  EXPECT_EQ(SpecStringAt(&spec, "/tokenizer"), &spec.tokenizer);
  EXPECT_EQ(SpecStringAt(&spec, "/data/train/1"), &spec.data.train[1]);
  ASSERT_NE(SpecStringAt(&spec, "/model/config/x/y"), nullptr);
  EXPECT_EQ(*SpecStringAt(&spec, "/model/config/x/y"), "z");
  for (const char* none :
       {"", "model/path", "/nope", "/model", "/train/lr", "/data/train", "/data/train/2", "/data/train/01",
        "/data/train/-", "/model/config", "/model/config/n", "/model/config/x", "/lora/base_dtype"}) {
    EXPECT_EQ(SpecStringAt(&spec, none), nullptr) << none;
  }
  spec.lora.emplace();  // an optional section once present
  EXPECT_EQ(SpecStringAt(&spec, "/lora/base_dtype"), &spec.lora->base_dtype);
  spec.data.train = {"one.jsonl"};  // a list of one may be written as its one string
  EXPECT_EQ(SpecStringAt(&spec, "/data/train"), &spec.data.train[0]);
}

TEST(JobSpec, AStoredSpecReadsBackAndItsObserverIsToldOfEveryParse) {
  auto path_of = [](const std::string& sha) -> StatusOr<std::string> { return "/blobs/" + sha; };
  std::vector<std::string> parsed;
  const SpecParseObserver observer = [&parsed](const std::string& where) { parsed.push_back(where); };
  auto spec = ValidateSpec(R"({"model": {"path": "/m"}, "data": {"train": ["/a.jsonl"]}, "seed": 7})", {},
                           path_of, nullptr, observer);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(parsed, std::vector<std::string>{"spec_json"});
  auto stored = ParseStoredSpec(CanonicalSpecJson(*spec), "job-1 spec", observer);
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  EXPECT_EQ(parsed, (std::vector<std::string>{"spec_json", "job-1 spec"}));
  EXPECT_FALSE(ValidateSpec("{", {}, path_of, nullptr, observer).ok());
  EXPECT_EQ(parsed.size(), 3u) << "a text that does not parse is a parse too";
  EXPECT_EQ((*stored)->seed, 7);
  EXPECT_EQ(CanonicalSpecJson(**stored), CanonicalSpecJson(*spec));
  EXPECT_THAT(ParseStoredSpec("{}", "job-1 spec"),
              StatusIs(StatusCode::kInvalidArgument, StartsWith("job-1 spec: field 'model': is required")));
  EXPECT_THAT(ParseStoredSpec("{", "job-1 spec"),
              StatusIs(StatusCode::kInvalidArgument, StartsWith("job-1 spec")));
}

TEST(JobSpec, FolderReferencesMakeOneFolderPerField) {
  TempDir d;
  const std::string a = Sha256Hex("a"), b = Sha256Hex("b");
  std::filesystem::create_directories(d.path() + "/blobs");
  std::ofstream(d.path() + "/blobs/" + a) << "config";
  std::ofstream(d.path() + "/blobs/" + b) << "tokenizer";
  auto path_of = [&](const std::string& sha) -> StatusOr<std::string> { return d.path() + "/blobs/" + sha; };
  const std::string spec_json =
      R"({"model": {"path": "local/model"}, "tokenizer": "t", "data": {"train": ["d"]}})";
  std::vector<SpecFolder> folders;
  auto spec = ValidateSpec(
      spec_json,
      {{"/model/path", a, "config.json"}, {"/tokenizer", b, ""}, {"/model/path", b, "sub/tok.json"}}, path_of,
      &folders);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->tokenizer, d.path() + "/blobs/" + b);
  ASSERT_EQ(folders.size(), 1u);
  EXPECT_EQ(folders[0].json_pointer, "/model/path");
  ASSERT_TRUE(MaterializeFolders(d.path() + "/job", folders, &*spec).ok());
  EXPECT_EQ(spec->model.path, d.path() + "/job/inputs/0");
  EXPECT_EQ(::sftctl::testing::ReadWholeFile(d.path() + "/job/inputs/0/config.json"), "config");
  EXPECT_EQ(::sftctl::testing::ReadWholeFile(d.path() + "/job/inputs/0/sub/tok.json"), "tokenizer");
  // A second attempt replaces the links instead of failing on them.
  EXPECT_TRUE(MaterializeFolders(d.path() + "/job", folders, &*spec).ok());

  struct Case {
    std::vector<SpecBlobRef> refs;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"/model/path", a, "ok.json"}, {"/model/path", b, "../x"}},
       "blobs[1].dir_entry: unsafe path '../x': has a '..' component"},
      {{{"/model/path", a, "/etc/passwd"}}, "blobs[0].dir_entry: unsafe path '/etc/passwd': absolute"},
      {{{"/model/path", a, "a//b"}}, "blobs[0].dir_entry: unsafe path 'a//b': has an empty component"},
      {{{"/model/path", a, "./a"}}, "blobs[0].dir_entry: unsafe path './a': has a '.' component"},
      {{{"/model/path", a, "c.json"}, {"/model/path", b, "c.json"}},
       "blobs[1].dir_entry: 'c.json' appears twice in the folder for '/model/path'"},
      {{{"/model/path", a, "c.json"}, {"/model/path", b, ""}},
       "blobs[1].json_pointer: '/model/path' is already set by blobs[0] as a folder (give every reference a "
       "dir_entry)"},
      {{{"/model/path", a, ""}, {"/model/path", b, "c.json"}},
       "blobs[1].dir_entry: '/model/path' is already set by blobs[0] as a single file (it has no dir_entry)"},
      {{{"/tokenizer", a, ""}, {"/tokenizer", b, ""}},
       "blobs[1].json_pointer: '/tokenizer' is already set by blobs[0]"},
      {{{"/model/path", a, "sub"}, {"/model/path", b, "sub/x.json"}},
       "blobs[1].dir_entry: 'sub/x.json' is inside 'sub', which is a file of the same folder"},
      {{{"/model/nope", a, "x.json"}},
       "blobs[0].json_pointer: '/model/nope' is not a path field of the job spec (a folder goes into a "
       "string)"},
  };
  for (const Case& c : cases) {
    auto bad = ValidateSpec(spec_json, c.refs, path_of, &folders);
    ASSERT_FALSE(bad.ok()) << c.message;
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(bad.status().message(), c.message);
  }
}

TEST(Auth, TokenFileIsPrivateAndChecked) {
  TempDir d;
  std::string path = d.path() + "/token";
  auto t = LoadOrCreateToken(path);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->size(), 64u);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(*LoadOrCreateToken(path), *t);
  ::chmod(path.c_str(), 0644);
  EXPECT_EQ(LoadOrCreateToken(path).status().code(), StatusCode::kPermissionDenied);
  Authenticator auth(*t);
  EXPECT_TRUE(auth.CheckHeader("Bearer " + *t, true).ok());
  EXPECT_EQ(auth.CheckHeader("", false).code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.CheckHeader("Bearer x", true).message(), "wrong bearer token");
  EXPECT_EQ(auth.CheckHeader(*t, true).code(), StatusCode::kUnauthenticated);
}

// The data dir holds the token and the jobs: only a private folder of this user is used.
TEST(DataDirTrust, OnlyAPrivateFolderOfThisUserIsUsed) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/data";
  std::filesystem::create_directory(dir);
  ::chmod(dir.c_str(), 0755);
  ASSERT_TRUE(CheckDataDirTrust(dir).ok());
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u) << "made private";

  ::chmod(dir.c_str(), 0777);
  Status s = CheckDataDirTrust(dir);
  EXPECT_THAT(s, StatusIs(StatusCode::kPermissionDenied, HasSubstr("writable by every user")));

  std::ofstream(tmp.path() + "/file") << "x";
  EXPECT_EQ(CheckDataDirTrust(tmp.path() + "/file").code(), StatusCode::kFailedPrecondition);

  if (::geteuid() == 0) {  // only root can give a folder away (CI runs as root)
    const std::string theirs = tmp.path() + "/theirs";
    std::filesystem::create_directory(theirs);
    ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
    s = CheckDataDirTrust(theirs);
    EXPECT_THAT(s,
                StatusIs(StatusCode::kPermissionDenied, HasSubstr("belongs to uid 65534, not to this user")));
  }
}

TEST(DataDirTrust, WithoutHomeTheDefaultIsTheUsersHomeNeverTmp) {
  const char* env[] = {"SFTD_DATA_DIR", "XDG_DATA_HOME", "HOME"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* e : env) {
    if (const char* v = std::getenv(e)) saved.emplace_back(e, v);
    ::unsetenv(e);
  }
  const std::string dir = DefaultDataDir();
  for (const auto& [k, v] : saved) ::setenv(k.c_str(), v.c_str(), 1);
  EXPECT_THAT(dir, Not(StartsWith("/tmp")));
  const passwd* pw = ::getpwuid(::geteuid());
  if (pw != nullptr && pw->pw_dir != nullptr && *pw->pw_dir) {
    EXPECT_EQ(dir, std::string(pw->pw_dir) + "/.local/share/sftd");
  } else {
    EXPECT_EQ(dir, "");
  }
}

// The data dir `sftctl bootstrap` records (~/.config/sftd/data_dir) comes after $SFTD_DATA_DIR and
// before the XDG/HOME default; a relative path there is skipped.
TEST(DataDirTrust, TheConfiguredDataDirSitsBetweenTheEnvironmentAndTheDefault) {
  const char* env[] = {"SFTD_DATA_DIR", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "HOME"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* e : env) {
    if (const char* v = std::getenv(e)) saved.emplace_back(e, v);
    ::unsetenv(e);
  }
  const TempDir home_dir("sftd-config");
  const std::string& home = home_dir.path();
  ::setenv("HOME", home.c_str(), 1);
  std::filesystem::create_directories(home + "/.config/sftd");
  const std::string conf = home + "/.config/sftd/data_dir";
  std::ofstream(conf) << "/workspace/sftd\n";
  const std::string configured = DefaultDataDir();
  ::setenv("SFTD_DATA_DIR", "/elsewhere", 1);
  const std::string from_env = DefaultDataDir();
  ::unsetenv("SFTD_DATA_DIR");
  std::ofstream(conf) << "relative/sftd\n";
  const std::string skipped = DefaultDataDir();
  ::setenv("XDG_CONFIG_HOME", (home + "/other").c_str(), 1);
  std::filesystem::create_directories(home + "/other/sftd");
  std::ofstream(home + "/other/sftd/data_dir") << "/lambda/nfs/team/sftd\n";
  const std::string xdg = DefaultDataDir();
  ::unsetenv("XDG_CONFIG_HOME");
  ::unsetenv("HOME");
  for (const auto& [k, v] : saved) ::setenv(k.c_str(), v.c_str(), 1);
  EXPECT_EQ(configured, "/workspace/sftd");
  EXPECT_EQ(from_env, "/elsewhere");
  EXPECT_EQ(skipped, home + "/.local/share/sftd");
  EXPECT_EQ(xdg, "/lambda/nfs/team/sftd");
}

// ~/.config/sftd/env holds the stop action's secrets: a file others can read or write, or that another
// user owns, is refused with the fix; a missing one is fine.
TEST(EnvFileTrust, OnlyAPrivateFileOfThisUserIsAccepted) {
  TempDir tmp;
  const std::string path = tmp.path() + "/env";
  EXPECT_TRUE(CheckEnvFileTrust(path).ok()) << "none";
  std::ofstream(path) << "LAMBDA_API_KEY=secret\n";
  ::chmod(path.c_str(), 0600);
  EXPECT_TRUE(CheckEnvFileTrust(path).ok());
  for (mode_t mode : {0640, 0620, 0604, 0602, 0644}) {
    ::chmod(path.c_str(), mode);
    EXPECT_THAT(CheckEnvFileTrust(path), StatusIs(StatusCode::kPermissionDenied,
                                                  HasSubstr("the environment file " + path +
                                                            " is readable or writable by group or others")))
        << std::oct << mode;
    EXPECT_THAT(CheckEnvFileTrust(path),
                StatusIs(StatusCode::kPermissionDenied, HasSubstr("`chmod 600 " + path + "`")));
  }
  ::chmod(path.c_str(), 0600);
  if (::geteuid() == 0) {  // only root can give a file away
    ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
    EXPECT_THAT(CheckEnvFileTrust(path),
                StatusIs(StatusCode::kPermissionDenied, HasSubstr("belongs to uid 65534, not to this user")));
  }
  std::filesystem::create_directory(tmp.path() + "/dir");
  EXPECT_THAT(CheckEnvFileTrust(tmp.path() + "/dir"),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("not a regular file")));
}

TEST(EnvFileTrust, ThePathFollowsXdgConfigHomeThenHome) {
  const char* env[] = {"XDG_CONFIG_HOME", "HOME"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* e : env) {
    if (const char* v = std::getenv(e)) saved.emplace_back(e, v);
    ::unsetenv(e);
  }
  ::setenv("HOME", "/home/u", 1);
  const std::string from_home = EnvFilePath();
  ::setenv("XDG_CONFIG_HOME", "/cfg", 1);
  const std::string from_xdg = EnvFilePath();
  ::unsetenv("XDG_CONFIG_HOME");
  ::unsetenv("HOME");
  for (const auto& [k, v] : saved) ::setenv(k.c_str(), v.c_str(), 1);
  EXPECT_EQ(from_home, "/home/u/.config/sftd/env");
  EXPECT_EQ(from_xdg, "/cfg/sftd/env");
}

// The one allowlist (common/os/process_util.h): what a rank and a stop command get of the agent's env.
TEST(ChildEnvironment, RanksAndStopCommandsGetOnlyWhatTheyUse) {
  const char* inherited[] = {"PATH=/bin",         "HOME=/root",
                             "HF_TOKEN=hf",       "LAMBDA_API_KEY=l",
                             "RUNPOD_POD_ID=p",   "AWS_ACCESS_KEY_ID=a",
                             "CUDA_HOME=/cuda",   "NCCL_DEBUG=INFO",
                             "LC_ALL=C",          "https_proxy=http://p",
                             "SFTCTL_PARALLEL=1", "OTHER=x",
                             "SSH_AUTH_SOCK=/s",  "CUDA_=x",
                             "NOEQUALS",          nullptr};
  EXPECT_EQ(ChildEnvironment(ChildKind::kRank, inherited),
            (std::vector<std::string>{"PATH=/bin", "HOME=/root", "CUDA_HOME=/cuda", "NCCL_DEBUG=INFO",
                                      "LC_ALL=C", "SFTCTL_PARALLEL=1"}));
  EXPECT_EQ(ChildEnvironment(ChildKind::kStopCommand, inherited),
            (std::vector<std::string>{"PATH=/bin", "HOME=/root", "LAMBDA_API_KEY=l", "RUNPOD_POD_ID=p",
                                      "AWS_ACCESS_KEY_ID=a", "LC_ALL=C", "https_proxy=http://p"}));
  EXPECT_FALSE(ChildEnvAllowed("HF_TOKEN", ChildKind::kRank));
  EXPECT_FALSE(ChildEnvAllowed("HF_TOKEN", ChildKind::kStopCommand));
  EXPECT_TRUE(ChildEnvAllowed("PYTORCH_CUDA_ALLOC_CONF", ChildKind::kRank));
  EXPECT_FALSE(ChildEnvAllowed("PYTORCH_CUDA_ALLOC_CONF", ChildKind::kStopCommand));
  // Slurm's commands: the basics only (what sbatch or srun carries may reach a job).
  EXPECT_EQ(ChildEnvironment(ChildKind::kSlurmCommand, inherited),
            (std::vector<std::string>{"PATH=/bin", "HOME=/root", "LC_ALL=C"}));
  // The patterns a Slurm job's script narrows the ranks' environment with: the same list.
  const std::vector<std::string> rank = ChildEnvPatterns(ChildKind::kRank);
  EXPECT_EQ(rank.front(), "PATH");
  EXPECT_NE(std::find(rank.begin(), rank.end(), "NCCL_*"), rank.end());
  EXPECT_EQ(std::find(rank.begin(), rank.end(), "AWS_*"), rank.end());
}

}  // namespace
}  // namespace sftctl::agent
