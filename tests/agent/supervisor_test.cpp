// The Supervisor in-process with the stub trainer and a clock the test moves forward: the step
// heartbeat and the kill grace are seen to expire without waiting for them. And the job spec: parsed
// once when the job is submitted and once when a restarted supervisor recovers it, never again.
#include "agent/jobs/supervisor.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "agent/state/job_spec.h"
#include "tests/agent/agent_test_util.h"
#include "tests/util/offset_clock.h"

namespace sftctl::agent {
namespace {

using ::sftctl::agent::testing::StubPath;
using ::sftctl::agent::testing::StubSpec;
using ::sftctl::agent::testing::TempDir;
using ::sftctl::testing::OffsetClock;
using ::sftctl::testing::WaitFor;
using namespace std::chrono_literals;

class SupervisorClock : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = StateStore::Open(dir_.path() + "/agent.db");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    blobs_ = std::make_unique<BlobStore>(dir_.path() + "/blobs", store_.get());
    ASSERT_TRUE(blobs_->Init().ok());
  }
  void TearDown() override {
    if (supervisor_) supervisor_->Stop();
    for (pid_t pgid : groups_) ::killpg(pgid, SIGKILL);
  }

  void StartSupervisor(std::chrono::milliseconds kill_grace) {
    SupervisorConfig cfg;
    cfg.data_dir = dir_.path();
    cfg.trainer_path = StubPath();
    cfg.kill_grace = kill_grace;
    cfg.poll = 20ms;
    cfg.clock = &clock_;
    cfg.fs = fs_;
    cfg.spec_parsed = [this](const std::string& where) {
      std::lock_guard<std::mutex> l(parsed_mu_);
      parsed_.push_back(where);
    };
    supervisor_ = std::make_unique<Supervisor>(cfg, store_.get(), blobs_.get(), &uploads_);
    ASSERT_TRUE(supervisor_->Start().ok());
  }

  JobRecord Submit(const nlohmann::json& stub) {
    v1::SubmitJobRequest req;
    req.set_spec_json(StubSpec(stub).dump());
    std::promise<StatusOr<JobRecord>> p;
    supervisor_->Submit(req, [&](StatusOr<JobRecord> r) { p.set_value(std::move(r)); });
    StatusOr<JobRecord> rec = p.get_future().get();
    EXPECT_TRUE(rec.ok()) << rec.status().ToString();
    return rec.ok() ? *rec : JobRecord();
  }

  // Polls the store until `pred(job)` holds (real time: the event thread's timers run on it).
  JobRecord WaitForJob(const std::string& id, const std::function<bool(const JobRecord&)>& pred) {
    JobRecord seen;
    const bool ok = WaitFor([&] {
      auto rec = store_->GetJob(id);
      if (rec.ok() && rec->pgid > 0 && groups_.empty()) groups_.push_back(static_cast<pid_t>(rec->pgid));
      if (!rec.ok() || !pred(*rec)) return false;
      seen = *rec;
      return true;
    });
    EXPECT_TRUE(ok) << "timed out waiting for " << id;
    return seen;
  }

  // The names of the spec texts every supervisor of this test parsed, in order (spec_parsed).
  std::vector<std::string> Parsed() {
    std::lock_guard<std::mutex> l(parsed_mu_);
    return parsed_;
  }

  // Returns once the supervisor has read the clock `n` more times: its timer has run (and judged the
  // time it saw) at least n - 1 times since the call.
  void WaitForClockReads(uint64_t n) {
    const uint64_t until = clock_.reads() + n;
    EXPECT_TRUE(WaitFor([&] { return clock_.reads() >= until; }))
        << "the supervisor stopped reading the clock";
  }

  TempDir dir_;
  OffsetClock clock_;
  FileSystem* fs_ = FileSystem::Default();  // the supervisor's (a test may inject faults)
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<BlobStore> blobs_;
  CheckpointUploads uploads_;  // outlives supervisor_
  std::mutex parsed_mu_;       // guards parsed_ (the blocking thread appends at submit)
  std::vector<std::string> parsed_;
  std::unique_ptr<Supervisor> supervisor_;
  std::vector<pid_t> groups_;
};

TEST_F(SupervisorClock, AHangIsDetectedWhenTheHeartbeatPassesOnTheClock) {
  StartSupervisor(10s);
  // One step, then silence; the default heartbeat is 1800 s.
  const JobRecord job = Submit({{"mode", "hang"}, {"hang_after", 1}, {"step_ms", 1}});
  WaitForJob(job.id, [](const JobRecord& r) { return r.state == JobState::RUNNING && r.last_step >= 1; });
  // Ten timer rounds at the unmoved clock: a hang wrongly seen in one would already have stopped it.
  WaitForClockReads(10);
  EXPECT_EQ(store_->GetJob(job.id)->state, JobState::RUNNING) << "no hang before the clock moves";
  clock_.Advance(1801s);
  const JobRecord failed = WaitForJob(job.id, [](const JobRecord& r) { return IsFinal(r.state); });
  EXPECT_EQ(failed.state, JobState::FAILED);
  EXPECT_EQ(failed.reason, "hang: no step event for 1800 s");
}

TEST_F(SupervisorClock, ARankIgnoringSigtermIsKilledWhenTheGracePassesOnTheClock) {
  StartSupervisor(std::chrono::hours(1));
  const JobRecord job = Submit({{"mode", "sleep"}, {"step_ms", 5}, {"ignore_term", true}});
  WaitForJob(job.id, [](const JobRecord& r) { return r.state == JobState::RUNNING && r.last_step >= 1; });
  std::promise<StatusOr<JobRecord>> cancelled;
  supervisor_->Cancel(job.id, [&](StatusOr<JobRecord> r) { cancelled.set_value(std::move(r)); });
  ASSERT_TRUE(cancelled.get_future().get().ok());
  WaitForClockReads(10);  // ten timer rounds within the grace, as the clock has not moved
  EXPECT_EQ(store_->GetJob(job.id)->state, JobState::CANCELLING) << "SIGTERM is ignored; the grace is 1 h";
  clock_.Advance(std::chrono::hours(1));
  const JobRecord done = WaitForJob(job.id, [](const JobRecord& r) { return IsFinal(r.state); });
  EXPECT_EQ(done.state, JobState::CANCELLED);
  ASSERT_EQ(done.ranks.size(), 1u);
  EXPECT_EQ(done.ranks[0].exit.signal, SIGKILL);
}

// The done-when of issue 38: one parse of the spec's text per submit and one per recovery, however
// many steps (queue, launch, uploads, ticks, cancel) read it. The supervisor tells its spec_parsed of
// every parse of a spec text (agent/state/job_spec.h), so a second parse anywhere on these paths fails this.
TEST_F(SupervisorClock, TheSpecIsParsedOnceAtSubmitAndOnceAtRecovery) {
  StartSupervisor(10s);
  const JobRecord job = Submit({{"mode", "sleep"}, {"step_ms", 5}});
  ASSERT_NE(job.spec, nullptr) << "the record carries the typed spec";
  EXPECT_EQ(job.spec->output_dir, job.job_dir + "/run");
  WaitForJob(job.id, [](const JobRecord& r) { return r.state == JobState::RUNNING && r.last_step >= 1; });
  WaitForClockReads(5);  // a few ticks of the running job
  EXPECT_EQ(Parsed(), std::vector<std::string>{"spec_json"}) << "submit, queue, launch, uploads, ticks";
  EXPECT_EQ(supervisor_->SpecOf(job.id), job.spec);

  // A restarted agent (the ranks run on): recovery parses the stored text once.
  supervisor_->Stop();
  supervisor_.reset();
  StartSupervisor(10s);
  const std::vector<std::string> both = {"spec_json", job.id + " spec"};
  EXPECT_EQ(Parsed(), both);
  const std::shared_ptr<const JobSpec> recovered = supervisor_->SpecOf(job.id);
  ASSERT_NE(recovered, nullptr);
  EXPECT_EQ(CanonicalSpecJson(*recovered), CanonicalSpecJson(*job.spec));
  WaitForClockReads(5);
  std::promise<StatusOr<JobRecord>> cancelled;
  supervisor_->Cancel(job.id, [&](StatusOr<JobRecord> r) { cancelled.set_value(std::move(r)); });
  StatusOr<JobRecord> cancelling = cancelled.get_future().get();
  ASSERT_TRUE(cancelling.ok()) << cancelling.status().ToString();
  EXPECT_EQ(cancelling->spec, recovered);
  EXPECT_EQ(WaitForJob(job.id, [](const JobRecord& r) { return IsFinal(r.state); }).state,
            JobState::CANCELLED);
  EXPECT_EQ(Parsed(), both) << "recovery, ticks, cancel, the end";
  EXPECT_TRUE(WaitFor([&] { return supervisor_->SpecOf(job.id) == nullptr; })) << "dropped once final";
}

// The cost cap's cancel (agent/stopping/auto_stop.h): every job that is not final, running or queued, ends
// CANCELLED with the reason (its state history says it once); a finished job is left alone, and
// a second call while the running job is still stopping changes nothing.
TEST_F(SupervisorClock, CancelAllCancelsRunningAndQueuedJobsWithTheReason) {
  StartSupervisor(10s);
  const JobRecord finished = Submit({{"steps", 1}});
  WaitForJob(finished.id, [](const JobRecord& r) { return IsFinal(r.state); });
  const JobRecord running = Submit({{"mode", "sleep"}, {"step_ms", 5}, {"ignore_term", true}});
  const JobRecord queued = Submit({{"mode", "sleep"}, {"step_ms", 5}});  // one CPU slot: it waits
  WaitForJob(running.id, [](const JobRecord& r) { return r.state == JobState::RUNNING && r.last_step >= 1; });
  ASSERT_EQ(store_->GetJob(queued.id)->state, JobState::QUEUED);
  const std::string reason = "cost cap $25.00 reached: $24.61 spent at $2.49/h since 2026-11-28T10:00:00Z";
  auto cancel_all = [&] {
    std::promise<size_t> n;
    supervisor_->CancelAll(reason, [&](size_t c) { n.set_value(c); });
    return n.get_future().get();
  };
  EXPECT_EQ(cancel_all(), 2u);
  EXPECT_EQ(store_->GetJob(running.id)->state, JobState::CANCELLING)
      << "SIGTERM is ignored; the grace is 10 s";
  EXPECT_EQ(cancel_all(), 0u) << "the running job is being cancelled already";
  clock_.Advance(10s);
  for (const JobRecord& job : {running, queued}) {
    const JobRecord end = WaitForJob(job.id, [](const JobRecord& r) { return IsFinal(r.state); });
    EXPECT_EQ(end.state, JobState::CANCELLED) << job.id;
    EXPECT_EQ(end.reason, reason) << job.id;
  }
  EXPECT_EQ(store_->GetJob(finished.id)->state, JobState::SUCCEEDED);
  auto history = store_->History(running.id);
  ASSERT_TRUE(history.ok());
  int cancelling = 0;
  for (const HistoryRecord& h : *history) {
    if (h.state == JobState::CANCELLING) {
      ++cancelling;
      EXPECT_EQ(h.reason, reason);
    }
  }
  EXPECT_EQ(cancelling, 1);
}

// A job whose stored spec no longer reads back (a damaged database) fails at recovery with the
// reason; the agent starts and serves the others.
TEST_F(SupervisorClock, AQueuedJobWhoseStoredSpecDoesNotReadBackFailsAtRecovery) {
  JobRecord rec;
  rec.job_dir = dir_.path() + "/jobs/";
  auto inserted = store_->InsertJob(rec);
  ASSERT_TRUE(inserted.ok()) << inserted.status().ToString();
  inserted->spec_json = R"({"model": {"config": {}}})";
  ASSERT_TRUE(store_->SaveJob(*inserted, nullptr).ok());
  StartSupervisor(10s);
  const JobRecord failed = WaitForJob(inserted->id, [](const JobRecord& r) { return IsFinal(r.state); });
  EXPECT_EQ(failed.state, JobState::FAILED);
  EXPECT_EQ(failed.reason,
            "agent-restart: cannot recover the job: its spec does not read back: " + inserted->id +
                " spec: field 'data': is required (data.train lists JSONL files)");
  EXPECT_EQ(supervisor_->SpecOf(inserted->id), nullptr);
}

// A disk that is full for the folders named `*/run` while `full` is set.
class FullForRunFolders : public ForwardingFileSystem {
 public:
  using ForwardingFileSystem::ForwardingFileSystem;
  Status CreateDirs(const std::string& path) override {
    if (full && path.size() >= 4 && path.compare(path.size() - 4, 4, "/run") == 0)
      return ResourceExhaustedError(path + ": No space left on device");
    return base()->CreateDirs(path);
  }
  std::atomic<bool> full{true};
};

// The disk fills between the job's record and its folder: the submit fails with the disk's error,
// and the job it recorded is FAILED with it -- not left QUEUED, for a retried submit (its client
// request id finds the job) or a restarted agent to take for a queued job.
TEST_F(SupervisorClock, ADiskFullWhileSettingUpAJobFailsTheJobItRecorded) {
  FullForRunFolders fs(FileSystem::Default());
  fs_ = &fs;
  StartSupervisor(10s);
  auto submit = [&] {
    v1::SubmitJobRequest req;
    req.set_spec_json(StubSpec({}).dump());
    req.set_client_request_id("request-1");
    std::promise<StatusOr<JobRecord>> p;
    supervisor_->Submit(req, [&](StatusOr<JobRecord> r) { p.set_value(std::move(r)); });
    return p.get_future().get();
  };
  const StatusOr<JobRecord> first = submit();
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(first.status().message().find(": cannot set up the job: "), std::string::npos)
      << first.status().ToString();
  EXPECT_NE(first.status().message().find("No space left on device"), std::string::npos)
      << first.status().ToString();
  auto jobs = store_->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status().ToString();
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ(jobs->front().state, JobState::FAILED);
  EXPECT_NE(jobs->front().reason.find("No space left on device"), std::string::npos) << jobs->front().reason;
  fs.full = false;
  const StatusOr<JobRecord> again = submit();  // the same request: the job recorded, as it ended
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->id, jobs->front().id);
  EXPECT_EQ(again->state, JobState::FAILED);
}

}  // namespace
}  // namespace sftctl::agent
