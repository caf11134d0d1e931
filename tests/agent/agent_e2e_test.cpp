// End-to-end tests of the real `sftd` binary with the stub trainer (see stub_trainer.cpp).
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <netinet/in.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "agent/state/state_store.h"
#include "agent_test_util.h"
#include "common/sha256.h"
#include "common/source_id.h"
#include "tests/util/status_matchers.h"

namespace sftctl::agent::testing {
namespace {

using ::sftctl::testing::RpcStatusIs;
using ::testing::AnyOfArray;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

struct Pulled {
  grpc::Status status;
  std::string data;
  std::string sha256;
  uint64_t total = 0;
};

Pulled Pull(Agent& a, const std::string& job, const std::string& path, uint64_t offset = 0,
            uint64_t length = 0) {
  v1::PullArtifactRequest req;
  req.set_job_id(job);
  req.set_path(path);
  req.set_offset(offset);
  req.set_length(length);
  auto ctx = a.Ctx();
  auto reader = a.stub()->PullArtifact(ctx.get(), req);
  Pulled out;
  v1::ArtifactChunk c;
  bool first = true;
  while (reader->Read(&c)) {
    if (first) {
      out.sha256 = c.sha256();
      out.total = c.total_size();
      first = false;
    }
    EXPECT_EQ(c.offset(), offset + out.data.size());
    out.data += c.data();
  }
  out.status = reader->Finish();
  return out;
}

grpc::Status Upload(Agent& a, const std::string& sha, const std::string& data, uint64_t size, uint64_t offset,
                    v1::BlobStatus* resp, const std::string& token_override = "") {
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer " + (token_override.empty() ? a.token() : token_override));
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  auto writer = a.stub()->UploadBlob(&ctx, resp);
  v1::UploadBlobRequest first;
  first.set_sha256(sha);
  first.set_size(size);
  first.set_offset(offset);
  writer->Write(first);
  for (size_t i = 0; i < data.size(); i += 1000) {
    v1::UploadBlobRequest m;
    m.set_data(data.substr(i, 1000));
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

class AgentE2E : public ::testing::Test {
 protected:
  void TearDown() override {
    for (pid_t g : groups_) KillGroup(g);
  }
  // Remembers a job's process group so a failing test cannot leak processes.
  void Track(const v1::Job& j) {
    if (j.ranks_size() > 0) groups_.push_back(static_cast<pid_t>(j.ranks(0).pid()));
  }
  TempDir dir_;
  std::vector<pid_t> groups_;
};

TEST_F(AgentE2E, SubmitStreamCompleteListAndPullArtifacts) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  v1::Job job;
  ASSERT_TRUE(a.Submit(StubSpec({{"steps", 5}, {"model_bytes", 3 << 20}}), &job).ok());
  EXPECT_EQ(job.id(), "job-1");
  std::vector<v1::Event> events = a.Events(job.id(), 0, /*follow=*/true);
  ASSERT_FALSE(events.empty());
  std::vector<v1::JobState> states;
  int steps = 0;
  bool saw_stdout = false, saw_stderr = false;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].seq(), i + 1) << "gap or reorder in the journal";
    if (events[i].kind() == v1::Event::STATE) states.push_back(events[i].state());
    if (events[i].kind() == v1::Event::METRIC && events[i].text().find("\"step\"") != std::string::npos &&
        nlohmann::json::parse(events[i].text())["event"] == "step") {
      ++steps;
    }
    saw_stdout |= events[i].kind() == v1::Event::STDOUT && events[i].text() == "step 3";
    saw_stderr |= events[i].kind() == v1::Event::STDERR && events[i].text() == "stub stderr line";
  }
  EXPECT_EQ(states, (std::vector<v1::JobState>{v1::QUEUED, v1::RUNNING, v1::SUCCEEDED}));
  EXPECT_EQ(steps, 5);
  EXPECT_TRUE(saw_stdout);
  EXPECT_TRUE(saw_stderr);
  EXPECT_EQ(events.back().kind(), v1::Event::STATE);

  v1::Job done = a.Get(job.id());
  EXPECT_EQ(done.state(), v1::SUCCEEDED);
  EXPECT_EQ(done.reason(), "all 1 rank(s) exited 0");
  EXPECT_EQ(done.first_failed_rank(), -1);
  EXPECT_EQ(done.last_step(), 5);
  EXPECT_EQ(done.last_seq(), events.back().seq());
  ASSERT_EQ(done.ranks_size(), 1);
  EXPECT_TRUE(done.ranks(0).exit_known());
  EXPECT_EQ(done.ranks(0).exit_code(), 0);
  // The effective spec points output_dir at the job's run folder.
  EXPECT_EQ(nlohmann::json::parse(done.spec_json())["output_dir"], done.job_dir() + "/run");

  v1::ListArtifactsRequest lreq;
  lreq.set_job_id(job.id());
  v1::ListArtifactsResponse list;
  ASSERT_TRUE(a.stub()->ListArtifacts(a.Ctx().get(), lreq, &list).ok());
  std::map<std::string, v1::Artifact> by_path;
  for (const auto& art : list.artifacts()) by_path[art.path()] = art;
  ASSERT_TRUE(by_path.count("run/checkpoint-000005/model.bin"));
  const v1::Artifact& model = by_path["run/checkpoint-000005/model.bin"];
  EXPECT_EQ(model.size(), 3u << 20);
  EXPECT_EQ(model.checkpoint_step(), 5);
  EXPECT_TRUE(model.checkpoint_complete());
  std::string local = done.job_dir() + "/run/checkpoint-000005/model.bin";
  EXPECT_EQ(model.sha256(), *Sha256File(local));

  Pulled p = Pull(a, job.id(), model.path());
  ASSERT_TRUE(p.status.ok()) << p.status.error_message();
  EXPECT_EQ(p.total, model.size());
  EXPECT_EQ(p.sha256, model.sha256());
  EXPECT_EQ(Sha256Hex(p.data), model.sha256());
  // Resume from an offset: the rest completes the file.
  Pulled rest = Pull(a, job.id(), model.path(), 1234567);
  ASSERT_TRUE(rest.status.ok()) << rest.status.error_message();
  EXPECT_EQ(p.data.substr(0, 1234567) + rest.data, p.data);
  Pulled past = Pull(a, job.id(), model.path(), model.size() + 1);
  EXPECT_EQ(past.status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  // A byte range (parallel pulls): exactly those bytes, with the whole file's size and sha256; a
  // range past the end is cut at the end.
  Pulled range = Pull(a, job.id(), model.path(), 1000000, 1500000);
  ASSERT_TRUE(range.status.ok()) << range.status.error_message();
  EXPECT_EQ(range.data, p.data.substr(1000000, 1500000));
  EXPECT_EQ(range.total, model.size());
  EXPECT_EQ(range.sha256, model.sha256());
  Pulled tail = Pull(a, job.id(), model.path(), model.size() - 10, 1 << 20);
  ASSERT_TRUE(tail.status.ok()) << tail.status.error_message();
  EXPECT_EQ(tail.data, p.data.substr(model.size() - 10));
}

TEST_F(AgentE2E, StreamEventsFromMiddleSeqGivesExactlyTheRest) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  v1::Job job;
  ASSERT_TRUE(a.Submit(StubSpec({{"steps", 20}, {"step_ms", 5}, {"log_lines", 3}}), &job).ok());
  a.WaitState(job.id(), v1::SUCCEEDED);
  std::vector<v1::Event> all = a.Events(job.id(), 0, false);
  ASSERT_GT(all.size(), 80u);
  uint64_t mid = all.size() / 2;
  std::vector<v1::Event> rest = a.Events(job.id(), mid, false);
  ASSERT_EQ(rest.size(), all.size() - mid);
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i].seq(), mid + 1 + i);
    EXPECT_EQ(rest[i].text(), all[mid + i].text());
  }
  EXPECT_TRUE(a.Events(job.id(), all.size(), false).empty());
  // A follower of a finished job gets the rest and ends.
  EXPECT_EQ(a.Events(job.id(), all.size() - 1, true).size(), 1u);
  grpc::Status s;
  a.Events("job-404", 0, false, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(AgentE2E, CancelMidRunLeavesNoProcessOfTheJob) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  v1::Job job;
  // Ignores SIGTERM (forces the SIGKILL escalation) and forks a child that must die too.
  ASSERT_TRUE(
      a.Submit(StubSpec({{"mode", "sleep"}, {"step_ms", 20}, {"ignore_term", true}, {"spawn_child", true}}),
               &job, 0, 2)
          .ok());
  v1::Job running =
      a.WaitJob(job.id(), [](const v1::Job& j) { return j.state() == v1::RUNNING && j.last_step() >= 2; });
  Track(running);
  ASSERT_EQ(running.ranks_size(), 2);
  pid_t pgid = static_cast<pid_t>(running.ranks(0).pid());
  EXPECT_GE(GroupMembers(pgid).size(), 4u);  // 2 ranks + 2 children

  v1::CancelJobRequest creq;
  creq.set_job_id(job.id());
  v1::Job cancelling;
  ASSERT_TRUE(a.stub()->CancelJob(a.Ctx().get(), creq, &cancelling).ok());
  EXPECT_EQ(cancelling.state(), v1::CANCELLING);
  v1::Job done = a.WaitState(job.id(), v1::CANCELLED);
  EXPECT_EQ(done.reason(), "cancelled by user");
  EXPECT_TRUE(GroupMembers(pgid).empty());
  for (const auto& r : done.ranks()) {
    EXPECT_FALSE(ProcessAlive(static_cast<pid_t>(r.pid())));
    EXPECT_EQ(r.signal(), SIGKILL) << "SIGTERM was ignored, so the grace period must end in SIGKILL";
  }
  v1::Job again;
  grpc::Status s = a.stub()->CancelJob(a.Ctx().get(), creq, &again);
  EXPECT_THAT(s, RpcStatusIs(grpc::StatusCode::FAILED_PRECONDITION, HasSubstr("CANCELLED")));
  creq.set_job_id("job-99");
  EXPECT_EQ(a.stub()->CancelJob(a.Ctx().get(), creq, &again).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(AgentE2E, AgentSigkillRestartReattachesLiveJobKeepsQueuedJob) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start({"--gpus", "0"}));
  v1::Job j1, j2;
  ASSERT_TRUE(a.Submit(StubSpec({{"mode", "sleep"}, {"step_ms", 20}}), &j1, 1).ok());
  ASSERT_TRUE(a.Submit(StubSpec({{"steps", 2}}), &j2, 1).ok());
  v1::Job r1 = a.WaitJob(j1.id(), [](const v1::Job& j) { return j.last_step() >= 2; });
  Track(r1);
  EXPECT_EQ(a.Get(j2.id()).state(), v1::QUEUED);
  uint64_t seq_before = r1.last_seq();
  a.Kill();

  Agent b(dir_.path());
  ASSERT_TRUE(b.Start({"--gpus", "0"}));
  v1::Job after = b.Get(j1.id());
  EXPECT_EQ(after.state(), v1::RUNNING);
  ASSERT_EQ(after.ranks_size(), 1);
  EXPECT_EQ(after.ranks(0).pid(), r1.ranks(0).pid());
  EXPECT_EQ(b.Get(j2.id()).state(), v1::QUEUED);
  // Re-attached: progress keeps flowing into the same journal, with no gap.
  v1::Job progressed =
      b.WaitJob(j1.id(), [&](const v1::Job& j) { return j.last_step() >= r1.last_step() + 3; });
  EXPECT_GT(progressed.last_seq(), seq_before);
  std::vector<v1::Event> ev = b.Events(j1.id(), 0, false);
  for (size_t i = 0; i < ev.size(); ++i) ASSERT_EQ(ev[i].seq(), i + 1);

  v1::CancelJobRequest creq;
  creq.set_job_id(j1.id());
  v1::Job tmp;
  ASSERT_TRUE(b.stub()->CancelJob(b.Ctx().get(), creq, &tmp).ok());
  b.WaitState(j1.id(), v1::CANCELLED);
  EXPECT_TRUE(GroupMembers(static_cast<pid_t>(r1.ranks(0).pid())).empty());
  // The GPU is free again: the queued job runs to completion.
  b.WaitState(j2.id(), v1::SUCCEEDED);
}

TEST_F(AgentE2E, RanksDyingWhileAgentDownFailWithAgentRestartAndRequeue) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  v1::Job j1, j2;
  ASSERT_TRUE(a.Submit(StubSpec({{"mode", "sleep"}, {"step_ms", 20}}), &j1).ok());
  ASSERT_TRUE(a.Submit(StubSpec({{"mode", "sleep"}, {"step_ms", 20}}), &j2, 0, 1, /*max_restarts=*/1).ok());
  v1::Job r1 = a.WaitJob(j1.id(), [](const v1::Job& j) { return j.last_step() >= 1; });
  v1::Job r2 = a.WaitJob(j2.id(), [](const v1::Job& j) { return j.last_step() >= 1; });
  Track(r1);
  Track(r2);
  a.Kill();
  for (const v1::Job& j : {r1, r2}) {
    pid_t pgid = static_cast<pid_t>(j.ranks(0).pid());
    KillGroup(pgid);
    ASSERT_TRUE(WaitFor([&] { return GroupMembers(pgid).empty(); }));
  }

  Agent b(dir_.path());
  ASSERT_TRUE(b.Start());
  v1::Job f1 = b.WaitState(j1.id(), v1::FAILED);
  EXPECT_THAT(f1.reason(), HasSubstr("agent-restart"));
  // j2 had a restart budget: re-queued with the reason, then relaunched.
  v1::Job again =
      b.WaitJob(j2.id(), [](const v1::Job& j) { return j.state() == v1::RUNNING && j.restarts() == 1; });
  Track(again);
  bool saw_requeue = false;
  v1::Job j2_now = b.Get(j2.id());
  for (const auto& h : j2_now.history()) {
    saw_requeue |= h.state() == v1::QUEUED && h.reason().find("agent-restart") != std::string::npos;
  }
  EXPECT_TRUE(saw_requeue);
  EXPECT_NE(again.ranks(0).pid(), r2.ranks(0).pid());
  v1::CancelJobRequest creq;
  creq.set_job_id(j2.id());
  v1::Job tmp;
  ASSERT_TRUE(b.stub()->CancelJob(b.Ctx().get(), creq, &tmp).ok());
  b.WaitState(j2.id(), v1::CANCELLED);
}

// A job RUNNING when the agent died, whose ranks all died too, and whose process-group number now
// names an unrelated group (a `setsid sleep`; the recorded pgid is pointed at it, standing in for
// the kernel reusing the number): the restarted agent fails the job and signals nobody.
TEST_F(AgentE2E, ARestartedAgentNeverSignalsAReusedProcessGroup) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  v1::Job j;
  ASSERT_TRUE(a.Submit(StubSpec({{"mode", "sleep"}, {"step_ms", 20}}), &j).ok());
  v1::Job r = a.WaitJob(j.id(), [](const v1::Job& x) { return x.last_step() >= 1; });
  Track(r);
  a.Kill();
  const pid_t pgid = static_cast<pid_t>(r.ranks(0).pid());
  KillGroup(pgid);
  ASSERT_TRUE(WaitFor([&] { return GroupMembers(pgid).empty(); }));

  // An unrelated process group; a signal sent to it stays pending, so the check below needs no wait.
  const pid_t stranger = SpawnBystander({"setsid", "sleep", "60"});
  ASSERT_GT(stranger, 0);
  ASSERT_TRUE(WaitFor([&] { return GroupMembers(stranger).size() == 1; })) << "setsid did not take effect";
  {
    auto store = StateStore::Open(a.data_dir() + "/agent.db");
    ASSERT_TRUE(store.ok()) << store.status().message();
    auto rec = (*store)->GetJob(j.id());
    ASSERT_TRUE(rec.ok()) << rec.status().message();
    rec->pgid = stranger;
    ASSERT_TRUE((*store)->SaveJob(*rec, nullptr).ok());
  }

  Agent b(dir_.path());
  ASSERT_TRUE(b.Start());
  v1::Job f = b.WaitState(j.id(), v1::FAILED);
  EXPECT_THAT(f.reason(), HasSubstr("agent-restart"));
  // The agent signals a job's group before it records the job's final state.
  EXPECT_TRUE(NoSignalReached(stranger)) << "the restarted agent signalled an unrelated process group";
  ::kill(stranger, SIGKILL);
  ::waitpid(stranger, nullptr, 0);
}

// Issue 37, item 4: a rank record whose "event" is not a string ({"event":7}) made the agent that
// recovered the job's journal throw (type_error.302), on every start. Now the record is skipped: the
// agent starts, ends the job whose ranks died, and runs another.
TEST_F(AgentE2E, ABadRankRecordInARecoveredJournalDoesNotStopTheRestartedAgent) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  v1::Job j;
  const nlohmann::json bad = nlohmann::json::array({{{"event", 7}, {"step", 1}},
                                                    {{"event", "step"}, {"step", "one"}},
                                                    {{"event", "error"}, {"message", 3}}});
  ASSERT_TRUE(a.Submit(StubSpec({{"mode", "sleep"}, {"step_ms", 20}, {"extra_events", bad}}), &j).ok());
  v1::Job r = a.WaitJob(j.id(), [](const v1::Job& x) { return x.last_step() >= 2; });
  Track(r);
  a.Kill();
  const pid_t pgid = static_cast<pid_t>(r.ranks(0).pid());
  KillGroup(pgid);
  ASSERT_TRUE(WaitFor([&] { return GroupMembers(pgid).empty(); }));

  Agent b(dir_.path());
  ASSERT_TRUE(b.Start());
  v1::Job f = b.WaitState(j.id(), v1::FAILED);
  EXPECT_THAT(f.reason(), HasSubstr("agent-restart: ranks ended while the agent was down"));
  v1::Job other;
  ASSERT_TRUE(b.Submit(StubSpec({{"steps", 2}}), &other).ok());
  b.WaitState(other.id(), v1::SUCCEEDED);
}

// Issue 49: the journal replay of a recovered job reads the trainer's event lines as the live tail does
// (common/event_line.h, through NoteTrainerEvent): the error event a rank sent before the agent went
// down names the trainer's error in the recovered job's reason, as it would have live.
TEST_F(AgentE2E, ARecoveredJobsReasonCarriesTheTrainerErrorItsJournalHolds) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  v1::Job j;
  const nlohmann::json error = nlohmann::json::array(
      {{{"event", "error"}, {"code", "INTERNAL"}, {"message", "stub error before the restart"}}});
  ASSERT_TRUE(a.Submit(StubSpec({{"mode", "sleep"}, {"step_ms", 20}, {"extra_events", error}}), &j).ok());
  v1::Job r = a.WaitJob(j.id(), [](const v1::Job& x) { return x.last_step() >= 2; });
  Track(r);
  a.Kill();
  const pid_t pgid = static_cast<pid_t>(r.ranks(0).pid());
  KillGroup(pgid);
  ASSERT_TRUE(WaitFor([&] { return GroupMembers(pgid).empty(); }));

  Agent b(dir_.path());
  ASSERT_TRUE(b.Start());
  EXPECT_EQ(
      b.WaitState(j.id(), v1::FAILED).reason(),
      "agent-restart: ranks ended while the agent was down (trainer error: stub error before the restart)");
}

// Issue 37, item 4, the record itself: a job whose database row is damaged (a rendezvous whose
// num_nodes is a string; it threw while the jobs were listed) or whose journal cannot be opened (a
// folder in its place) is failed with the reason; the agent starts and serves the other jobs.
TEST_F(AgentE2E, ADamagedJobRecordFailsThatJobAndTheAgentServesTheOthers) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  v1::Job damaged, no_journal, fine;
  ASSERT_TRUE(a.Submit(StubSpec({{"mode", "sleep"}, {"step_ms", 20}}), &damaged).ok());
  ASSERT_TRUE(a.Submit(StubSpec({{"mode", "sleep"}, {"step_ms", 20}}), &no_journal).ok());
  ASSERT_TRUE(a.Submit(StubSpec({{"mode", "sleep"}, {"step_ms", 20}}), &fine).ok());
  std::vector<v1::Job> running;
  for (const v1::Job& j : {damaged, no_journal, fine}) {
    running.push_back(a.WaitJob(j.id(), [](const v1::Job& x) { return x.last_step() >= 1; }));
    Track(running.back());
  }
  a.Kill();
  for (const v1::Job& r : {running[0], running[1]}) {  // `fine` stays alive across the restart
    const pid_t pgid = static_cast<pid_t>(r.ranks(0).pid());
    KillGroup(pgid);
    ASSERT_TRUE(WaitFor([&] { return GroupMembers(pgid).empty(); }));
  }
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((a.data_dir() + "/agent.db").c_str(), &db), SQLITE_OK);
    const std::string sql =
        "UPDATE jobs SET rendezvous='{\"num_nodes\":\"two\"}' WHERE id='" + damaged.id() + "'";
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    sqlite3_close(db);
  }
  const std::string journal = running[1].job_dir() + "/journal.jsonl";
  ASSERT_TRUE(std::filesystem::remove(journal));
  ASSERT_TRUE(std::filesystem::create_directory(journal));

  Agent b(dir_.path());
  ASSERT_TRUE(b.Start());
  EXPECT_THAT(b.WaitState(damaged.id(), v1::FAILED).reason(),
              HasSubstr("agent-restart: cannot recover the job: its record is damaged: rendezvous: field "
                        "'num_nodes': expected an integer >= 0, got string"));
  EXPECT_THAT(b.WaitState(no_journal.id(), v1::FAILED).reason(),
              HasSubstr("agent-restart: cannot recover the job: cannot open '" + journal + "'"));
  // The healthy job was re-attached, and a new one runs.
  EXPECT_EQ(b.Get(fine.id()).state(), v1::RUNNING);
  v1::Job other;
  ASSERT_TRUE(b.Submit(StubSpec({{"steps", 2}}), &other).ok());
  b.WaitState(other.id(), v1::SUCCEEDED);
  v1::CancelJobRequest creq;
  creq.set_job_id(fine.id());
  v1::Job tmp;
  ASSERT_TRUE(b.stub()->CancelJob(b.Ctx().get(), creq, &tmp).ok());
  b.WaitState(fine.id(), v1::CANCELLED);
}

// Issue 37, item 5: `sftctl status` and `sftctl logs --tensorboard` aborted (exit 134) on metric records
// the agent supplied: {"event":7,...}, and a step record whose "step" is a string as the newest one.
// Now they skip such records: status shows the job and the newest good step record's figures, and the
// TensorBoard file gets the good steps.
TEST_F(AgentE2E, ClientSkipsMetricRecordsOfTheWrongShape) {
  if (!std::filesystem::exists(Bin("sftctl")))
    GTEST_SKIP() << "built without the client (SFTCTL_BUILD_CLIENT)";
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  const nlohmann::json bad = nlohmann::json::array({{{"event", 7}, {"step", 1}, {"loss", 0.5}}});
  const nlohmann::json last =
      nlohmann::json::array({{{"event", "step"}, {"step", 3}, {"rss_mb", 2048.0}},
                             {{"event", 7}, {"step", 4}},
                             {{"event", "step"}, {"step", "four"}, {"rss_mb", 1024.0}}});
  v1::Job j;
  ASSERT_TRUE(a.Submit(StubSpec({{"steps", 2}, {"extra_events", bad}, {"last_events", last}}), &j).ok());
  a.WaitState(j.id(), v1::SUCCEEDED);
  TempDir home("h37-home");
  const std::vector<std::string> env = {"HOME=" + home.path(), "XDG_CONFIG_HOME=" + home.path() + "/config"};
  auto status = RunCommand({Bin("sftctl"), "status", "--host", "local:" + dir_.path(), j.id()}, env);
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_THAT(status.output, HasSubstr("at step 3: rss 2.00G")) << status.output;
  const std::string tb = home.path() + "/tb";
  auto logs =
      RunCommand({Bin("sftctl"), "logs", "--host", "local:" + dir_.path(), j.id(), "--tensorboard", tb}, env);
  EXPECT_EQ(logs.exit_code, 0) << logs.output;
  EXPECT_TRUE(std::filesystem::exists(tb)) << logs.output;
}

TEST_F(AgentE2E, SigkillOneRankFailsJobNamingSignalAndStopsOthers) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  v1::Job job;
  ASSERT_TRUE(a.Submit(StubSpec({{"mode", "sleep"}, {"step_ms", 20}}), &job, 0, 3).ok());
  v1::Job running = a.WaitJob(job.id(), [](const v1::Job& j) { return j.last_step() >= 1; });
  Track(running);
  ASSERT_EQ(running.ranks_size(), 3);
  ::kill(static_cast<pid_t>(running.ranks(1).pid()), SIGKILL);
  v1::Job failed = a.WaitState(job.id(), v1::FAILED);
  EXPECT_EQ(failed.reason(), "rank 1 failed first: killed by signal 9 (SIGKILL)");
  EXPECT_EQ(failed.first_failed_rank(), 1);
  EXPECT_EQ(failed.ranks(1).signal(), SIGKILL);
  for (const auto& r : failed.ranks()) {
    EXPECT_FALSE(r.running());
    EXPECT_FALSE(ProcessAlive(static_cast<pid_t>(r.pid()))) << "rank " << r.rank();
  }
  EXPECT_EQ(failed.ranks(0).signal(), SIGTERM) << "the surviving ranks get SIGTERM";
  EXPECT_TRUE(GroupMembers(static_cast<pid_t>(running.ranks(0).pid())).empty());
}

TEST_F(AgentE2E, CrashWithRestartBudgetResumesFromCheckpoint) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  v1::Job job;
  ASSERT_TRUE(a.Submit(StubSpec({{"mode", "crash"},
                                 {"steps", 6},
                                 {"checkpoint_every", 2},
                                 {"crash_at", 4},
                                 {"crash_once", true},
                                 {"exit_code", 7}}),
                       &job, 0, 1, /*max_restarts=*/2)
                  .ok());
  v1::Job done = a.WaitJob(
      job.id(), [](const v1::Job& j) { return j.state() == v1::SUCCEEDED || j.state() == v1::FAILED; });
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_EQ(done.restarts(), 1u);
  bool saw = false;
  for (const auto& h : done.history()) {
    saw |= h.state() == v1::QUEUED &&
           h.reason() ==
               "restart 1/2 after: rank 0 failed first: exit code 7 (trainer error: stub crash at step 4)";
  }
  EXPECT_TRUE(saw);
  // The record's times are its history's: the latest launch, and the end (every view of the run
  // time agrees, with or without the history).
  int64_t last_launch = 0;
  for (const auto& h : done.history())
    if (h.state() == v1::RUNNING) last_launch = h.time_unix_ms();
  ASSERT_GT(done.history_size(), 0);
  EXPECT_EQ(done.started_unix_ms(), last_launch);
  EXPECT_EQ(done.finished_unix_ms(), done.history(done.history_size() - 1).time_unix_ms());
  EXPECT_EQ(done.first_failed_rank(), -1) << "the successful relaunch had no failed rank";
  bool resumed = false;
  for (const auto& e : a.Events(job.id(), 0, false))
    resumed |= e.text().find("resume_from=2") != std::string::npos;
  EXPECT_TRUE(resumed) << "the relaunch resumes from checkpoint-000002";
}

TEST_F(AgentE2E, HangBecomesFailedHang) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  v1::Job job;
  ASSERT_TRUE(a.Submit(StubSpec({{"mode", "hang"}, {"hang_after", 1}, {"step_ms", 10}}), &job, 0, 1, 0,
                       /*heartbeat_s=*/1)
                  .ok());
  v1::Job failed = a.WaitState(job.id(), v1::FAILED);
  Track(failed);
  EXPECT_EQ(failed.reason(), "hang: no step event for 1 s");
  EXPECT_EQ(failed.last_step(), 1);
  EXPECT_TRUE(GroupMembers(static_cast<pid_t>(failed.ranks(0).pid())).empty());
}

TEST_F(AgentE2E, MissingOrWrongTokenIsUnauthenticated) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  struct stat st;
  ASSERT_EQ(::stat(a.ready()["token_file"].get<std::string>().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  for (const std::string& header :
       std::vector<std::string>{"", "Bearer nope", "Basic " + a.token(), "Bearer " + a.token() + "x"}) {
    grpc::ClientContext ctx;
    if (!header.empty()) ctx.AddMetadata("authorization", header);
    v1::VersionResponse v;
    grpc::Status s = a.stub()->Version(&ctx, v1::VersionRequest(), &v);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << header;
  }
  {
    grpc::ClientContext ctx;
    v1::StreamEventsRequest req;
    req.set_job_id("job-1");
    auto reader = a.stub()->StreamEvents(&ctx, req);
    v1::StreamEventsResponse m;
    EXPECT_FALSE(reader->Read(&m));
    grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(s.error_message(), "missing 'authorization: Bearer <token>' metadata");
  }
  {
    v1::BlobStatus resp;
    grpc::Status s = Upload(a, Sha256Hex("x"), "x", 1, 0, &resp, "wrong");
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(s.error_message(), "wrong bearer token");
  }
  v1::VersionResponse v;
  ASSERT_TRUE(a.stub()->Version(a.Ctx().get(), v1::VersionRequest(), &v).ok());
  EXPECT_EQ(v.protocol(), 1u);
  EXPECT_EQ(v.version(), a.ready()["version"]);
  // The source id of this build (share/sftctl/SOURCE_ID beside bin/), as the client compares it.
  EXPECT_EQ(v.source_id(), SourceId());
  EXPECT_EQ(v.source_id().size(), 64u);
  EXPECT_EQ(a.ready()["source_id"], SourceId());
}

TEST_F(AgentE2E, PathTraversalAndSymlinkEscapeAreRejected) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  v1::Job job;
  ASSERT_TRUE(a.Submit(StubSpec({{"steps", 1}}), &job).ok());
  v1::Job done = a.WaitState(job.id(), v1::SUCCEEDED);
  std::string secret = dir_.path() + "/secret.txt";
  std::ofstream(secret) << "top secret";
  std::filesystem::create_symlink(secret, done.job_dir() + "/run/evil");
  std::filesystem::create_symlink("../../../token", done.job_dir() + "/run/evil2");
  std::filesystem::create_symlink(done.job_dir() + "/spec.json", done.job_dir() + "/run/ok-link");

  EXPECT_EQ(Pull(a, job.id(), "../../token").status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Pull(a, job.id(), "run/../../../token").status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  Pulled abs = Pull(a, job.id(), secret);
  EXPECT_THAT(abs.status, RpcStatusIs(grpc::StatusCode::INVALID_ARGUMENT, HasSubstr("absolute")));
  Pulled evil = Pull(a, job.id(), "run/evil");
  EXPECT_EQ(evil.status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(evil.data.empty());
  EXPECT_EQ(Pull(a, job.id(), "run/evil2").status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Pull(a, job.id(), "run/missing").status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Pull(a, job.id(), "run").status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Pull(a, "job-77", "spec.json").status.error_code(), grpc::StatusCode::NOT_FOUND);
  // A symlink that stays inside the job folder is fine.
  Pulled ok = Pull(a, job.id(), "run/ok-link");
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.data, ReadWholeFile(done.job_dir() + "/spec.json"));
  // Listing never includes symlinks.
  v1::ListArtifactsRequest lreq;
  lreq.set_job_id(job.id());
  v1::ListArtifactsResponse list;
  ASSERT_TRUE(a.stub()->ListArtifacts(a.Ctx().get(), lreq, &list).ok());
  for (const auto& art : list.artifacts()) EXPECT_THAT(art.path(), Not(HasSubstr("evil")));
}

TEST_F(AgentE2E, MalformedSpecIsInvalidArgumentNamingTheField) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  v1::SubmitJobRequest req;
  v1::Job job;
  auto submit = [&]() { return a.stub()->SubmitJob(a.Ctx().get(), req, &job); };
  req.set_spec_json("[1, 2]");
  grpc::Status s = submit();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "spec_json: not a JSON object");
  req.set_spec_json("{\"output_dir\": 5}");
  s = submit();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "spec_json.output_dir: must be a string");
  req.set_spec_json("{not json");
  s = submit();
  EXPECT_THAT(s, RpcStatusIs(grpc::StatusCode::INVALID_ARGUMENT, StartsWith("spec_json: invalid JSON")));
  req.set_spec_json("{\"data\": {}}");
  auto* ref = req.add_blobs();
  ref->set_json_pointer("data/train");  // missing leading '/'
  ref->set_sha256(Sha256Hex("x"));
  s = submit();
  EXPECT_THAT(s, RpcStatusIs(grpc::StatusCode::INVALID_ARGUMENT, StartsWith("blobs[0].json_pointer")));
  ref->set_json_pointer("/nope/train");
  s = submit();
  EXPECT_THAT(s, RpcStatusIs(grpc::StatusCode::INVALID_ARGUMENT, StartsWith("blobs[0].json_pointer")));
  ref->set_json_pointer("/data/train");
  s = submit();
  EXPECT_THAT(s, RpcStatusIs(grpc::StatusCode::FAILED_PRECONDITION, HasSubstr("not uploaded")));
  req.clear_blobs();
  // Whatever is not a job spec the trainer would take is refused at the submit, naming the field.
  s = submit();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "spec_json: field 'model': is required (give model.path or model.config)");
  nlohmann::json spec = StubSpec({{"steps", 1}});
  spec["train"]["learning_rate"] = 0.1;
  req.set_spec_json(spec.dump());
  s = submit();
  EXPECT_THAT(s, RpcStatusIs(grpc::StatusCode::INVALID_ARGUMENT,
                             StartsWith("spec_json: field 'train.learning_rate': unknown field")));
  req.set_spec_json(StubSpec({{"steps", 1}}).dump());
  req.set_gpus(1);
  s = submit();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "gpus: job wants 1 GPUs, host has 0");
  req.set_cpu_ranks(2);
  s = submit();
  EXPECT_THAT(s, RpcStatusIs(grpc::StatusCode::INVALID_ARGUMENT, StartsWith("cpu_ranks")));
  v1::ListJobsResponse list;
  ASSERT_TRUE(a.stub()->ListJobs(a.Ctx().get(), v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 0) << "rejected submissions leave no job behind";
}

// Specs that used to throw out of the validator and abort sftd: a number out of range, a list
// index past 2^64 in a blob's JSON pointer, and nesting deep enough to overflow a recursive dump.
TEST_F(AgentE2E, HostileSpecsAreInvalidArgumentAndTheAgentKeepsAnswering) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  struct Case {
    std::string spec, pointer;
    std::vector<::testing::Matcher<std::string>> message_starts;  // any of these names the problem
  };
  const std::vector<Case> cases = {
      {R"({"x": 1e400})", "", {StartsWith("spec_json: ")}},
      {R"({"data": {"train": ["a"]}})",
       "/data/train/99999999999999999999",
       {StartsWith("blobs[0].json_pointer"), StartsWith("spec_json: ")}},
      {std::string(100000, '[') + std::string(100000, ']'),
       "",
       {StartsWith("spec_json: JSON nested more than 64 levels")}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    v1::SubmitJobRequest req;
    req.set_spec_json(cases[i].spec);
    if (!cases[i].pointer.empty()) {
      auto* ref = req.add_blobs();
      ref->set_json_pointer(cases[i].pointer);
      ref->set_sha256(Sha256Hex("x"));
    }
    v1::Job job;
    grpc::Status s = a.stub()->SubmitJob(a.Ctx().get(), req, &job);
    EXPECT_THAT(s, RpcStatusIs(grpc::StatusCode::INVALID_ARGUMENT, AnyOfArray(cases[i].message_starts)))
        << "case " << i;
    v1::VersionResponse v;
    ASSERT_TRUE(a.stub()->Version(a.Ctx().get(), v1::VersionRequest(), &v).ok()) << "sftd died on case " << i;
  }
}

// A client that cancels while the agent finishes an upload (fsync + hashing a whole resumed partial
// file, long enough for the cancel to land in between) leaves the agent serving, and the blob whole.
// The agent used to write the answer into memory gRPC had already freed (the asan preset sees it).
TEST_F(AgentE2E, ACancelDuringASlowUploadFinishLeavesTheAgentServing) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
#ifdef __SANITIZE_THREAD__
  const size_t mib = 2;  // under ThreadSanitizer megabyte messages crawl (16 MiB took over 60 s)
#else
  const size_t mib = 96;
#endif
  std::string data(mib << 20, '\0');
  for (size_t i = 0; i < data.size(); i += 4096) data[i] = static_cast<char>(i >> 12);
  const std::string sha = Sha256Hex(data);
  auto send = [&](grpc::ClientContext* ctx, uint64_t from, uint64_t to, v1::BlobStatus* resp) {
    auto writer = a.stub()->UploadBlob(ctx, resp);
    v1::UploadBlobRequest first;
    first.set_sha256(sha);
    first.set_size(data.size());
    first.set_offset(from);
    writer->Write(first);
    for (uint64_t i = from; i < to; i += 1 << 20) {
      v1::UploadBlobRequest m;
      m.set_data(data.substr(i, std::min<uint64_t>(1 << 20, to - i)));
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    return writer;
  };
  // All but the last KiB: kept as a partial (DATA_LOSS: short).
  const uint64_t held = data.size() - 1024;
  {
    auto ctx = a.Ctx();
    v1::BlobStatus resp;
    EXPECT_EQ(send(ctx.get(), 0, held, &resp)->Finish().error_code(), grpc::StatusCode::DATA_LOSS);
  }
  // The rest, resumed: Finish hashes the whole blob from disk; the client cancels meanwhile.
  {
    auto ctx = a.Ctx();
    v1::BlobStatus resp;
    auto writer = send(ctx.get(), held, data.size(), &resp);
    std::this_thread::sleep_for(20ms);
    ctx->TryCancel();
    grpc::Status s = writer->Finish();
    EXPECT_TRUE(s.ok() || s.error_code() == grpc::StatusCode::CANCELLED) << s.error_message();
  }
  v1::VersionResponse v;
  grpc::Status vs = a.stub()->Version(a.Ctx().get(), v1::VersionRequest(), &v);
  ASSERT_TRUE(vs.ok()) << "the agent stopped answering: " << vs.error_message();
  // Nothing is lost: either the finish ran to its end, or (the cancel came before the agent had
  // the last bytes) the partial is kept and a resume completes it. Either way the blob is whole.
  v1::StatBlobRequest sreq;
  sreq.set_sha256(sha);
  v1::BlobStatus st;
  // The cancelled finish may still be hashing: wait for it a few seconds, then resume what is kept.
  WaitFor([&] { return a.stub()->StatBlob(a.Ctx().get(), sreq, &st).ok() && st.complete(); }, 5s);
  if (!st.complete()) {
    ASSERT_GE(st.size(), held);
    auto ctx = a.Ctx();
    v1::BlobStatus resp;
    grpc::Status resumed = send(ctx.get(), st.size(), data.size(), &resp)->Finish();
    ASSERT_TRUE(resumed.ok()) << resumed.error_message();
    EXPECT_TRUE(resp.complete());
  }
  EXPECT_EQ(Sha256Hex(ReadWholeFile(a.data_dir() + "/blobs/" + sha)), sha);
}

TEST_F(AgentE2E, UploadBlobVerifiesResumesDeduplicatesAndFeedsSpec) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 3);
  std::string sha = Sha256Hex(data);
  std::string blob_path = a.data_dir() + "/blobs/" + sha;

  // Wrong bytes for the digest: rejected, nothing stored.
  v1::BlobStatus resp;
  std::string bad = data;
  bad[500] ^= 1;
  grpc::Status s = Upload(a, sha, bad, data.size(), 0, &resp);
  EXPECT_THAT(s, RpcStatusIs(grpc::StatusCode::DATA_LOSS, HasSubstr("nothing stored")));
  v1::StatBlobRequest sreq;
  sreq.set_sha256(sha);
  v1::BlobStatus st;
  ASSERT_TRUE(a.stub()->StatBlob(a.Ctx().get(), sreq, &st).ok());
  EXPECT_FALSE(st.complete());
  EXPECT_EQ(st.size(), 0u);
  EXPECT_FALSE(std::filesystem::exists(blob_path));
  EXPECT_FALSE(std::filesystem::exists(a.data_dir() + "/blobs/partial/" + sha));

  // A half upload is kept; resuming at the wrong offset is refused; the right one completes.
  s = Upload(a, sha, data.substr(0, 40000), data.size(), 0, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS);
  ASSERT_TRUE(a.stub()->StatBlob(a.Ctx().get(), sreq, &st).ok());
  EXPECT_EQ(st.size(), 40000u);
  s = Upload(a, sha, data.substr(30000), data.size(), 30000, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  s = Upload(a, sha, data.substr(40000), data.size(), 40000, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.complete());
  EXPECT_FALSE(resp.deduplicated());
  EXPECT_EQ(ReadWholeFile(blob_path), data);
  // Again: deduplicated, no bytes needed.
  v1::BlobStatus again;
  s = Upload(a, sha, "", data.size(), 0, &again);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(again.deduplicated());
  sreq.set_sha256("ABC");
  EXPECT_EQ(a.stub()->StatBlob(a.Ctx().get(), sreq, &st).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // The blob feeds a job: the spec field is rewritten to the blob's path.
  v1::SubmitJobRequest req;
  req.set_spec_json(StubSpec({{"steps", 1}}).dump());
  auto* ref = req.add_blobs();
  ref->set_json_pointer("/data/train/0");
  ref->set_sha256(sha);
  req.set_client_request_id("req-1");
  v1::Job job, job2;
  ASSERT_TRUE(a.stub()->SubmitJob(a.Ctx().get(), req, &job).ok());
  ASSERT_TRUE(a.stub()->SubmitJob(a.Ctx().get(), req, &job2).ok());
  EXPECT_EQ(job2.id(), job.id()) << "same client_request_id: same job";
  v1::Job done = a.WaitState(job.id(), v1::SUCCEEDED);
  EXPECT_EQ(nlohmann::json::parse(done.spec_json())["data"]["train"][0], blob_path);
}

// Ranged uploads through the real agent's UploadBlob reactor: blocks in any order, StatBlob's blocks
// held, a short block not held, the block that completes the blob answered complete.
TEST_F(AgentE2E, RangedUploadBlocksCompleteTheBlobInAnyOrder) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 13 + 1);
  const std::string sha = Sha256Hex(data);
  constexpr uint64_t kBlock = 30000;
  auto send = [&](uint64_t b, size_t cut, v1::BlobStatus* resp) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + a.token());
    ctx.set_deadline(std::chrono::system_clock::now() + 60s);
    auto writer = a.stub()->UploadBlob(&ctx, resp);
    const uint64_t off = b * kBlock, len = std::min<uint64_t>(kBlock, data.size() - off);
    v1::UploadBlobRequest first;
    first.set_sha256(sha);
    first.set_size(data.size());
    first.set_offset(off);
    first.set_length(len);
    first.set_block(kBlock);
    writer->Write(first);
    v1::UploadBlobRequest m;
    m.set_data(data.substr(off, std::min<uint64_t>(len, cut)));
    writer->Write(m);
    writer->WritesDone();
    return writer->Finish();
  };
  v1::BlobStatus resp;
  for (uint64_t b : {3, 1, 2}) {
    grpc::Status s = send(b, SIZE_MAX, &resp);
    ASSERT_TRUE(s.ok()) << b << ": " << s.error_message();
    EXPECT_FALSE(resp.complete());
  }
  EXPECT_EQ(send(0, 100, &resp).error_code(), grpc::StatusCode::DATA_LOSS);  // a short block
  v1::StatBlobRequest sreq;
  sreq.set_sha256(sha);
  v1::BlobStatus st;
  ASSERT_TRUE(a.stub()->StatBlob(a.Ctx().get(), sreq, &st).ok());
  EXPECT_EQ(st.block(), kBlock);
  EXPECT_EQ(std::vector<uint64_t>(st.blocks_held().begin(), st.blocks_held().end()),
            (std::vector<uint64_t>{1, 2, 3}));
  // A held block sent again (the client lost the answer and resends it) is verified and answered;
  // with other bytes it is refused and the block stays as it was.
  grpc::Status s = send(1, SIZE_MAX, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(resp.complete());
  data[kBlock + 5] ^= 1;
  s = send(1, SIZE_MAX, &resp);
  EXPECT_THAT(s, RpcStatusIs(grpc::StatusCode::FAILED_PRECONDITION,
                             HasSubstr("block 1 of blob " + sha + " is already held with other bytes")));
  data[kBlock + 5] ^= 1;
  s = send(0, SIZE_MAX, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.complete());
  EXPECT_EQ(ReadWholeFile(a.data_dir() + "/blobs/" + sha), data);
  ASSERT_TRUE(a.stub()->StatBlob(a.Ctx().get(), sreq, &st).ok());
  EXPECT_TRUE(st.complete());
  EXPECT_EQ(st.blocks_held_size(), 0);
}

TEST_F(AgentE2E, TwoJobsWantingMoreGpusThanExistOneQueued) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start({"--gpus", "0,1"}));
  v1::Job j1, j2;
  ASSERT_TRUE(a.Submit(StubSpec({{"mode", "sleep"}, {"step_ms", 20}}), &j1, 2).ok());
  ASSERT_TRUE(a.Submit(StubSpec({{"mode", "sleep"}, {"step_ms", 20}}), &j2, 2).ok());
  v1::Job r1 = a.WaitJob(j1.id(), [](const v1::Job& j) { return j.last_step() >= 1; });
  Track(r1);
  EXPECT_EQ(r1.state(), v1::RUNNING);
  EXPECT_EQ(std::vector<uint32_t>(r1.assigned_gpus().begin(), r1.assigned_gpus().end()),
            (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(r1.world_size(), 2u);
  EXPECT_EQ(a.Get(j2.id()).state(), v1::QUEUED);
  v1::HealthResponse h;
  ASSERT_TRUE(a.stub()->Health(a.Ctx().get(), v1::HealthRequest(), &h).ok());
  EXPECT_EQ(h.gpus_total(), 2u);
  EXPECT_EQ(h.gpus_free(), 0u);
  EXPECT_EQ(h.jobs_queued(), 1u);
  bool env_ok = false;
  for (const auto& e : a.Events(j1.id(), 0, false)) {
    env_ok |= e.rank() == 1 && e.text().find("world 2 CUDA_VISIBLE_DEVICES=0,1") != std::string::npos;
  }
  EXPECT_TRUE(env_ok);
  v1::CancelJobRequest creq;
  creq.set_job_id(j1.id());
  v1::Job tmp;
  ASSERT_TRUE(a.stub()->CancelJob(a.Ctx().get(), creq, &tmp).ok());
  v1::Job r2 = a.WaitJob(j2.id(), [](const v1::Job& j) { return j.state() == v1::RUNNING; });
  Track(r2);
  creq.set_job_id(j2.id());
  ASSERT_TRUE(a.stub()->CancelJob(a.Ctx().get(), creq, &tmp).ok());
  a.WaitState(j2.id(), v1::CANCELLED);
}

// A running agent built from another source (same version number: `sftctl bootstrap` installed a new
// build) is replaced by `sftd start`, like one of another version; status names its source id.
TEST_F(AgentE2E, AnAgentOfAnotherSourceIsRestarted) {
  std::string d = dir_.path() + "/data";
  auto [rc1, out1] = RunForStdout({SftdPath(), "start", "--detach", "--data-dir", d, "--gpus", "none"});
  ASSERT_EQ(rc1, 0) << out1;
  auto r1 = nlohmann::json::parse(out1.substr(11));
  auto [rc2, st] = RunForStdout({SftdPath(), "status", "--json", "--data-dir", d});
  EXPECT_EQ(nlohmann::json::parse(st)["source_id"], SourceId());
  // Pretend the running agent is an older build.
  std::ofstream(d + "/sftd.source_id") << std::string(64, '0') << "\n";
  auto [rc3, out3] = RunForStdout({SftdPath(), "start", "--detach", "--data-dir", d});
  ASSERT_EQ(rc3, 0) << out3;
  auto r3 = nlohmann::json::parse(out3.substr(11));
  EXPECT_NE(r3["pid"], r1["pid"]);
  EXPECT_EQ(r3["source_id"], SourceId());
  EXPECT_TRUE(WaitFor([&] { return !ProcessAlive(r1["pid"].get<pid_t>()); }));
  EXPECT_EQ(RunForStdout({SftdPath(), "stop", "--data-dir", d}).exit_code, 0);
}

TEST_F(AgentE2E, DetachedStartIsIdempotentStatusStopAndVersionRestart) {
  std::string d = dir_.path() + "/data";
  auto [rc1, out1] = RunForStdout({SftdPath(), "start", "--detach", "--data-dir", d, "--gpus", "none"});
  ASSERT_EQ(rc1, 0);
  ASSERT_THAT(out1, StartsWith("SFTD_READY "));
  EXPECT_EQ(std::count(out1.begin(), out1.end(), '\n'), 1) << "exactly one line";
  auto r1 = nlohmann::json::parse(out1.substr(11));
  auto [rc2, out2] = RunForStdout({SftdPath(), "start", "--detach", "--data-dir", d});
  ASSERT_EQ(rc2, 0);
  auto r2 = nlohmann::json::parse(out2.substr(11));
  EXPECT_EQ(r2["pid"], r1["pid"]);
  EXPECT_EQ(r2["addr"], r1["addr"]);
  auto [rc3, out3] = RunForStdout({SftdPath(), "status", "--json", "--data-dir", d});
  EXPECT_EQ(rc3, 0);
  auto s = nlohmann::json::parse(out3);
  EXPECT_EQ(s["running"], true);
  EXPECT_EQ(s["healthy"], true);
  EXPECT_EQ(s["pid"], r1["pid"]);
  // Another version: the running agent is replaced.
  auto [rc4, out4] =
      RunForStdout({SftdPath(), "start", "--detach", "--data-dir", d, "--version-override", "9.9.9"});
  ASSERT_EQ(rc4, 0) << out4;
  auto r4 = nlohmann::json::parse(out4.substr(11));
  EXPECT_NE(r4["pid"], r1["pid"]);
  EXPECT_EQ(r4["version"], "9.9.9");
  EXPECT_FALSE(ProcessAlive(r1["pid"].get<pid_t>()));
  auto [rc5, out5] = RunForStdout({SftdPath(), "stop", "--data-dir", d});
  EXPECT_EQ(rc5, 0);
  // `stop` returns once the lock is free, and the agent frees it last: agent.db is closed by then (its
  // write-ahead log checkpointed and gone), so whoever takes the folder next finds nothing still moving.
  EXPECT_TRUE(std::filesystem::exists(d + "/agent.db"));
  EXPECT_FALSE(std::filesystem::exists(d + "/agent.db-wal")) << "agent.db still open after `sftd stop`";
  EXPECT_TRUE(WaitFor([&] { return !ProcessAlive(r4["pid"].get<pid_t>()); }));
  auto [rc6, out6] = RunForStdout({SftdPath(), "status", "--json", "--data-dir", d});
  EXPECT_EQ(rc6, 3);
  EXPECT_EQ(nlohmann::json::parse(out6)["running"], false);
}

// 300 lines of 60 KB (18 MB) logged at once, just before the rank exits: every line is journaled
// (the final drain read only one 4 MiB chunk per file and lost the rest), and StreamEvents splits
// them into messages a client with gRPC's default 4 MiB receive limit can take (512 events per
// message was up to 32 MB).
TEST_F(AgentE2E, ABurstOfLongLinesStreamsWithinTheDefaultMessageLimit) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  v1::Job job;
#ifdef __SANITIZE_THREAD__
  const int lines = 20;  // under ThreadSanitizer megabyte messages crawl; the races are what it checks
#else
  const int lines = 300;  // 18 MB: several times a 4 MiB message
#endif
  ASSERT_TRUE(
      a.Submit(StubSpec({{"steps", 1}, {"bulk_lines", lines}, {"bulk_line_bytes", 60000}}), &job).ok());
  a.WaitState(job.id(), v1::SUCCEEDED);
  grpc::Status s;
  auto events = a.Events(job.id(), 0, /*follow=*/false, &s);
  ASSERT_TRUE(s.ok()) << s.error_message();
  int bulk = 0;
  for (const auto& e : events) bulk += e.text().rfind("bulk line ", 0) == 0 && e.text().size() == 60000;
  EXPECT_EQ(bulk, lines);
  for (size_t i = 1; i < events.size(); ++i) EXPECT_EQ(events[i].seq(), events[i - 1].seq() + 1);
}

// A data dir whose lock is held by another process and whose sftd.pid names an unrelated live
// process (a stale pid file, the pid reused): `sftd stop` must not signal it.
TEST_F(AgentE2E, StopNeverSignalsAStalePidThatIsNotAnAgent) {
  const std::string d = dir_.path() + "/data";
  std::filesystem::create_directories(d);
  const pid_t victim = SpawnBystander({"sleep", "60"});
  ASSERT_GT(victim, 0);
  // This test process holds the lock, as a running agent would.
  const int lock_fd = ::open((d + "/sftd.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(lock_fd, 0);
  ASSERT_EQ(::flock(lock_fd, LOCK_EX | LOCK_NB), 0);
  std::ofstream(d + "/sftd.pid") << victim << "\n";
  std::ofstream(d + "/sftd.port") << "1\n";
  std::ofstream(d + "/sftd.version") << "0.1.0\n";
  auto [rc, out] = RunForStdout({SftdPath(), "stop", "--data-dir", d});
  EXPECT_EQ(rc, 1) << out;
  // `sftd stop` has ended: a signal it sent would be pending in the victim now.
  EXPECT_TRUE(NoSignalReached(victim)) << "the unrelated process was signalled";
  ::close(lock_fd);
  ::kill(victim, SIGKILL);
  ::waitpid(victim, nullptr, 0);
}

TEST_F(AgentE2E, MissingTrainerFailsTheJobAtLaunch) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start({"--trainer", dir_.path() + "/no-such-trainer"}));
  v1::Job job;
  ASSERT_TRUE(a.Submit(StubSpec({{"steps", 1}}), &job).ok());
  v1::Job failed = a.WaitState(job.id(), v1::FAILED);
  EXPECT_THAT(failed.reason(), StartsWith("launch: starting rank 0: trainer not executable '" + dir_.path() +
                                          "/no-such-trainer'"));
  v1::ListJobsResponse list;
  ASSERT_TRUE(a.stub()->ListJobs(a.Ctx().get(), v1::ListJobsRequest(), &list).ok());
  ASSERT_EQ(list.jobs_size(), 1);
  EXPECT_EQ(list.jobs(0).state(), v1::FAILED);
}

TEST_F(AgentE2E, NonLoopbackListenWithoutTlsIsRefused) {
  auto [rc, out] =
      RunForStdout({SftdPath(), "start", "--data-dir", dir_.path(), "--listen", "0.0.0.0", "--gpus", "none"});
  EXPECT_EQ(rc, 1);
  EXPECT_THAT(out, HasSubstr("SFTD_ERROR refusing to listen on non-loopback address 0.0.0.0 without TLS"));
}

// An agent on IPv6 loopback reports and is dialled at [::1] everywhere: its SFTD_READY line, `status`
// (text and JSON, which the client reads over SSH), a second `start` that finds it, and `bridge`.
TEST_F(AgentE2E, ListenOnIpv6LoopbackIsReportedAndDialledAsIpv6) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start({"--listen", "::1"}));
  const std::string addr = a.ready()["addr"].get<std::string>();
  ASSERT_THAT(addr, StartsWith("[::1]:"));
  v1::VersionResponse v;
  grpc::Status s = a.stub()->Version(a.Ctx().get(), v1::VersionRequest(), &v);
  EXPECT_TRUE(s.ok()) << s.error_message();

  auto [rc, json] = RunForStdout({SftdPath(), "status", "--json", "--data-dir", dir_.path()});
  EXPECT_EQ(rc, 0) << json;
  auto st = nlohmann::json::parse(json, nullptr, false);
  EXPECT_EQ(st.value("addr", ""), addr) << json;
  EXPECT_EQ(st.value("healthy", false), true) << json;
  auto [rc2, again] = RunForStdout({SftdPath(), "start", "--data-dir", dir_.path(), "--gpus", "none"});
  EXPECT_EQ(rc2, 0);
  EXPECT_THAT(again, HasSubstr("\"addr\":\"" + addr + "\""));

  // `sftd bridge` reaches it too: one Version request written by hand would need HTTP/2, so check
  // that the bridge connects (it exits 1 with "cannot connect" when it dials the wrong family).
  int in[2];
  ASSERT_EQ(::pipe(in), 0);
  const std::string sftd = SftdPath(), data = dir_.path();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(in[0], 0);
    ::close(in[1]);
    int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execl(sftd.c_str(), sftd.c_str(), "bridge", "--data-dir", data.c_str(), nullptr);
    _exit(127);
  }
  ::close(in[0]);
  ::close(in[1]);  // EOF on stdin: a connected bridge finishes cleanly
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// sftd raises its soft open-file limit (ranks' output files, client sockets) to the hard limit.
TEST_F(AgentE2E, RaisesItsOpenFileLimit) {
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  if (old.rlim_max != RLIM_INFINITY && old.rlim_max <= 512) GTEST_SKIP() << "hard limit " << old.rlim_max;
  rlimit low = old;
  low.rlim_cur = 256;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  Agent a(dir_.path());
  auto started = a.Start();
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  ASSERT_TRUE(started);
  std::ifstream limits("/proc/" + std::to_string(a.pid()) + "/limits");
  std::string line, soft;
  while (std::getline(limits, line)) {
    if (line.rfind("Max open files", 0) == 0) {
      std::istringstream(line.substr(14)) >> soft;
    }
  }
  const unsigned long want =
      old.rlim_max == RLIM_INFINITY ? 65536 : std::min<unsigned long>(old.rlim_max, 65536);
  EXPECT_EQ(soft, std::to_string(want));
}

TEST_F(AgentE2E, BridgeCarriesGrpc) {
  Agent a(dir_.path());
  ASSERT_TRUE(a.Start());
  // A local listener whose accepted connection becomes `sftd bridge`'s stdin and stdout, the way an
  // SSH exec channel would carry it.
  int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::listen(lfd, 1);
  std::thread acceptor([&] {
    int c = ::accept(lfd, nullptr, nullptr);
    if (c < 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, c, 0);
    posix_spawn_file_actions_adddup2(&fa, c, 1);
    std::string bin = SftdPath(), sub = "bridge", flag = "--data-dir", d = dir_.path();
    char* argv[] = {bin.data(), sub.data(), flag.data(), d.data(), nullptr};
    pid_t pid;
    posix_spawn(&pid, argv[0], &fa, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(c);
    int status;
    ::waitpid(pid, &status, 0);
  });
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(ntohs(addr.sin_port)),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Agent::NewStub(channel);
  v1::VersionResponse v;
  grpc::Status s = stub->Version(a.Ctx().get(), v1::VersionRequest(), &v);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(v.protocol(), 1u);
  channel.reset();
  stub.reset();
  a.Stop();  // closes the agent side; the bridge exits
  acceptor.join();
  ::close(lfd);
}

// The env file the bootstrap script and the systemd unit load into sftd's environment holds secrets:
// `sftd start` refuses one that group or others can read or write, naming the file and the fix.
TEST_F(AgentE2E, StartRefusesAnEnvFileOthersCanRead) {
  const std::string conf = dir_.path() + "/config", env_file = conf + "/sftd/env";
  std::filesystem::create_directories(conf + "/sftd");
  std::ofstream(env_file) << "LAMBDA_API_KEY=secret\n";
  ::chmod(env_file.c_str(), 0644);
  CommandResult r = RunCommand({SftdPath(), "start", "--data-dir", dir_.path() + "/data", "--port", "0",
                                "--gpus", "none", "--trainer", StubPath()},
                               {"XDG_CONFIG_HOME=" + conf});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("SFTD_ERROR PERMISSION_DENIED: the environment file " + env_file +
                                  " is readable or writable by group or others (mode 0644)"));
  EXPECT_THAT(r.output, HasSubstr("run `chmod 600 " + env_file + "`"));
  ::chmod(env_file.c_str(), 0600);
  Agent a(dir_.path() + "/data");
  a.set_env({"XDG_CONFIG_HOME=" + conf});
  EXPECT_TRUE(a.Start());
}

}  // namespace
}  // namespace sftctl::agent::testing
