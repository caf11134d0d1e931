// The stop policy in the real sftd: a recording --stop-command (appends a line to a file) shows when
// the host would have been stopped. These tests prove the wiring and wait only for what happens (a
// fire, a state in Health or in the agent's log); what must NOT happen (a second fire, a stop while a
// job runs, a call is open or a final checkpoint is not pulled) is tested on a moved clock in
// auto_stop_test.cpp. Durations are a few seconds of real time.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <fstream>

#include "tests/agent/agent_test_util.h"
#include "tests/util/file_util.h"
#include "tests/util/status_matchers.h"

namespace sftctl::agent::testing {
namespace {

using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::RpcStatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Lines of the recording file ("" lines never occur).
int Fired(const std::string& path) {
  std::ifstream f(path);
  int n = 0;
  for (std::string line; std::getline(f, line);) n += !line.empty();
  return n;
}

std::vector<std::string> StopFlags(const std::string& record, const std::string& idle) {
  return {"--stop-when-idle", idle,  "--stop-command", "echo fired >> '" + record + "'",
          "--stop-check",     "50ms"};
}

// The agent's log (set_stderr_file) has `line`: Publish logs each state change as
// "auto-stop: <state> (<detail>)". Reading it is no client contact, so it renews no lease.
bool Logged(const std::string& log, const std::string& line) {
  return ReadWholeFile(log).find(line) != std::string::npos;
}

v1::AutoStopStatus Health(Agent& a) {
  v1::HealthResponse h;
  grpc::Status s = a.stub()->Health(a.Ctx().get(), v1::HealthRequest(), &h);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return h.auto_stop();
}

TEST(AutoStopE2eTest, IdleStopFiresAndARestartKeepsThePolicy) {
  TempDir dir;
  const std::string record = dir.path() + "/record";
  {
    Agent a(dir.path() + "/data");
    ASSERT_TRUE(a.Start(StopFlags(record, "1s")));
    ASSERT_TRUE(WaitFor([&] { return Fired(record) == 1; }));
    // The command writes its record before the agent sees it exit and records the outcome.
    ASSERT_TRUE(WaitFor([&] { return Health(a).state() != "stopping"; }));
    v1::AutoStopStatus st = Health(a);
    EXPECT_EQ(st.state(), "stopped");
    EXPECT_EQ(st.action(), "command");
    EXPECT_EQ(st.stop_when_idle_s(), 1);
    EXPECT_THAT(st.last_action(), HasSubstr("command: exit code 0 (idle for 1s)"));
    a.Stop();
  }
  ASSERT_EQ(Fired(record), 1);  // so the second line below is the restarted agent's
  // A restart without the flags keeps the policy (agent.db) and arms it afresh.
  Agent b(dir.path() + "/data");
  ASSERT_TRUE(b.Start({"--stop-check", "50ms"}));
  v1::AutoStopStatus st = Health(b);
  EXPECT_EQ(st.policy(), "stop when idle 1s, or 1m00s after a stop-when-done job; action command");
  EXPECT_THAT(st.last_action(), HasSubstr("exit code 0"));  // the previous agent's action
  ASSERT_TRUE(WaitFor([&] { return Fired(record) == 2; }));
}

// Polling Health renews the lease, but a running job holds the host anyway (and its count comes
// before the open calls in the detail).
// The idle period of the two tests below: 1 s, scaled for a sanitized build (a slower agent must not
// go idle before the test's first call reaches it).
const std::string kScaledIdle = std::to_string(SFTCTL_TEST_TIME_SCALE) + "s";

TEST(AutoStopE2eTest, RunningJobPostponesTheStop) {
  TempDir dir;
  const std::string record = dir.path() + "/record";
  Agent a(dir.path() + "/data");
  ASSERT_TRUE(a.Start(StopFlags(record, kScaledIdle)));
  v1::Job job;
  // ~2 s (scaled): longer than the idle period.
  ASSERT_TRUE(a.Submit(StubSpec({{"steps", 40 * SFTCTL_TEST_TIME_SCALE}, {"step_ms", 50}}), &job).ok());
  v1::AutoStopStatus st;
  ASSERT_TRUE(WaitFor([&] {
    st = Health(a);
    return st.state() == "busy" && st.detail() == "1 job(s) running or queued";
  })) << st.state()
      << ": " << st.detail();
  ASSERT_TRUE(WaitFor([&] { return Fired(record) == 1; }));
  // The job outlasts the idle period: a fire while it ran would find it still running here.
  EXPECT_EQ(a.Get(job.id()).state(), v1::SUCCEEDED);
}

TEST(AutoStopE2eTest, OpenClientCallPostponesTheStop) {
  TempDir dir;
  const std::string record = dir.path() + "/record", log = dir.path() + "/sftd.log";
  Agent a(dir.path() + "/data");
  a.set_stderr_file(log);
  ASSERT_TRUE(a.Start(StopFlags(record, kScaledIdle)));
  // An upload stream left open, like a `logs -f`, counts as a connected client.
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer " + a.token());
  v1::BlobStatus resp;
  auto writer = a.stub()->UploadBlob(&ctx, &resp);
  v1::UploadBlobRequest first;
  first.set_sha256(std::string(64, 'a'));
  first.set_size(10);
  ASSERT_TRUE(writer->Write(first));
  // No other call is made (Health would count as one): the stream alone holds the host.
  ASSERT_TRUE(WaitFor([&] { return Logged(log, "auto-stop: busy (1 client call(s) open)"); }))
      << ReadWholeFile(log);
  ctx.TryCancel();
  (void)writer->Finish();
  ASSERT_TRUE(WaitFor([&] { return Fired(record) == 1; }));
}

TEST(AutoStopE2eTest, StopWhenDoneWaitsForThePullOfTheFinalCheckpoint) {
  TempDir dir;
  const std::string record = dir.path() + "/record", log = dir.path() + "/sftd.log";
  Agent a(dir.path() + "/data");
  a.set_stderr_file(log);
  ASSERT_TRUE(a.Start({"--stop-command", "echo fired >> '" + record + "'", "--stop-grace", "1s",
                       "--stop-storage", "lost", "--stop-pull-timeout", "10m", "--stop-check", "50ms"}));
  EXPECT_EQ(Health(a).state(), "off");
  v1::SubmitJobRequest req;
  req.set_spec_json(StubSpec({{"steps", 4}, {"checkpoint_every", 2}}).dump());
  req.set_stop_when_done(true);
  v1::Job job;
  ASSERT_TRUE(a.stub()->SubmitJob(a.Ctx().get(), req, &job).ok());
  EXPECT_TRUE(job.stop_when_done());
  a.WaitState(job.id(), v1::SUCCEEDED);
  // Every call renews the lease, so the agent's log is watched instead: past the grace, it waits for
  // the pull.
  ASSERT_TRUE(WaitFor([&] {
    return Logged(
        log, "auto-stop: await_pull (" + job.id() + ": final checkpoint not pulled yet (`sftctl pull`))");
  })) << ReadWholeFile(log);

  // Pull the newest complete checkpoint's DONE (the client pulls it last).
  v1::ListArtifactsRequest lreq;
  lreq.set_job_id(job.id());
  v1::ListArtifactsResponse list;
  ASSERT_TRUE(a.stub()->ListArtifacts(a.Ctx().get(), lreq, &list).ok());
  std::string done;
  int64_t newest = -1;
  for (const auto& art : list.artifacts()) {
    const std::string& p = art.path();
    if (art.checkpoint_complete() && art.checkpoint_step() > newest && p.size() > 5 &&
        p.compare(p.size() - 5, 5, "/DONE") == 0) {
      newest = art.checkpoint_step();
      done = p;
    }
  }
  ASSERT_EQ(newest, 4) << "no complete checkpoint listed";
  v1::PullArtifactRequest preq;
  preq.set_job_id(job.id());
  preq.set_path(done);
  auto pctx = a.Ctx();
  auto reader = a.stub()->PullArtifact(pctx.get(), preq);
  v1::ArtifactChunk chunk;
  while (reader->Read(&chunk)) {
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_TRUE(WaitFor([&] { return Fired(record) == 1; }));
  ASSERT_TRUE(WaitFor([&] { return Health(a).state() != "stopping"; }));  // the outcome is recorded
  EXPECT_EQ(Health(a).state(), "stopped");
}

// While the action runs, and once it succeeded, a submission is refused (the job would be lost with
// the host); the client is told why and to go elsewhere. The action here waits for a file.
TEST(AutoStopE2eTest, SubmissionsAreRefusedOnceTheHostIsStopping) {
  TempDir dir;
  const std::string record = dir.path() + "/record", release = dir.path() + "/release";
  Agent a(dir.path() + "/data");
  ASSERT_TRUE(a.Start({"--stop-when-idle", "1s", "--stop-check", "50ms", "--stop-command",
                       "echo fired >> '" + record + "'; i=0; while [ ! -e '" + release +
                           "' ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"}));
  ASSERT_TRUE(WaitFor([&] { return Fired(record) == 1; }));
  EXPECT_EQ(Health(a).state(), "stopping");
  v1::Job job;
  grpc::Status s = a.Submit(StubSpec({{"steps", 1}}), &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "the host is stopping (auto-stop: idle for 1s); submit to another host");
  std::ofstream(release) << "go\n";
  ASSERT_TRUE(WaitFor([&] { return Health(a).state() == "stopped"; }));
  s = a.Submit(StubSpec({{"steps", 1}}), &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << "the action succeeded: the host goes";
  v1::ListJobsResponse list;
  ASSERT_TRUE(a.stub()->ListJobs(a.Ctx().get(), v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 0) << "no job was created";
}

TEST(AutoStopE2eTest, StopWhenDoneIsRefusedWithoutAStopAction) {
  TempDir dir;
  Agent a(dir.path() + "/data");
  ASSERT_TRUE(a.Start());
  v1::SubmitJobRequest req;
  req.set_spec_json(StubSpec({{"steps", 1}}).dump());
  req.set_stop_when_done(true);
  v1::Job job;
  grpc::Status s = a.stub()->SubmitJob(a.Ctx().get(), req, &job);
  EXPECT_THAT(
      s, RpcStatusIs(grpc::StatusCode::FAILED_PRECONDITION, HasSubstr("stop_when_done: no stop action")));
}

TEST(AutoStopE2eTest, IdleStopWithoutAnActionIsRefusedAtStart) {
  TempDir dir;
  CommandResult r = RunCommand({SftdPath(), "start", "--data-dir", dir.path() + "/data", "--port", "0",
                                "--gpus", "none", "--stop-when-idle", "1h"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, AllOf(HasSubstr("SFTD_ERROR"), HasSubstr("no stop action")));
}

// "2001-09-09T01:46:40Z" (the agent's FormatUtc; this test does not link the agent's library).
std::string Utc(int64_t unix_s) {
  const std::time_t t = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The cost cap in the real sftd with the stub trainer. $3600/h is $1 a second; billing began 100 s ago
// ($100 spent); the lead is 1 s (--stop-check 50ms, rounded up) + 2 s (--kill-grace 500ms, rounded up,
// + 1 s) + 120 s (the action's timeout) = 123 s, so a $235 cap is reached about 12 s after the start.
// The running job is cancelled with the cap's reason (its log and its final state say it) and keeps its
// complete checkpoints, submissions are refused naming the cap, and the action runs once.
TEST(AutoStopE2eTest, CostCapCancelsTheRunningJobAndStopsTheHost) {
  TempDir dir;
  const std::string record = dir.path() + "/record";
  const int64_t since =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count() -
      100;
  Agent a(dir.path() + "/data");
  ASSERT_TRUE(
      a.Start({"--stop-command", "echo fired >> '" + record + "'", "--stop-check", "50ms", "--price-per-hour",
               "3600", "--max-cost", "235", "--billing-since", std::to_string(since)}));
  v1::Job job;
  ASSERT_TRUE(a.Submit(StubSpec({{"steps", 4000}, {"step_ms", 50}, {"checkpoint_every", 2}}), &job).ok());
  v1::AutoStopStatus st = Health(a);
  EXPECT_EQ(st.max_cost(), 235);
  EXPECT_EQ(st.billing_since_unix_s(), since);
  EXPECT_GE(st.spent(), 100);
  EXPECT_FALSE(st.cost_cap_reached());
  EXPECT_GT(st.cost_cap_remaining_s(), 0);
  EXPECT_LE(st.cost_cap_remaining_s(), 12);
  ASSERT_TRUE(WaitFor([&] { return Fired(record) == 1; }));

  const v1::Job ended = a.WaitState(job.id(), v1::CANCELLED);
  EXPECT_THAT(ended.reason(), AllOf(HasSubstr("cost cap $235.00 reached: $"),
                                    HasSubstr(" spent at $3600.00/h since " + Utc(since))));
  // `sftctl logs`: the journal's state events carry the reason.
  bool logged = false;
  for (const v1::Event& e : a.Events(job.id(), 0, /*follow=*/false)) {
    logged |= e.kind() == v1::Event::STATE && e.state() == v1::CANCELLED && e.text() == ended.reason();
  }
  EXPECT_TRUE(logged) << "no CANCELLED event with the cap's reason";
  // Cancelled as a user's cancel is: the complete checkpoints stay.
  v1::ListArtifactsRequest lreq;
  lreq.set_job_id(job.id());
  v1::ListArtifactsResponse list;
  ASSERT_TRUE(a.stub()->ListArtifacts(a.Ctx().get(), lreq, &list).ok());
  int complete = 0;
  for (const auto& art : list.artifacts()) complete += art.checkpoint_complete() && art.checkpoint_step() > 0;
  EXPECT_GT(complete, 0) << "no complete checkpoint kept";

  v1::Job refused;
  EXPECT_THAT(a.Submit(StubSpec({{"steps", 1}}), &refused),
              RpcStatusIs(grpc::StatusCode::FAILED_PRECONDITION,
                          "the host is stopping (" + ended.reason() + "); submit to another host"));
  ASSERT_TRUE(WaitFor([&] { return Health(a).state() == "stopped"; }));
  st = Health(a);
  EXPECT_TRUE(st.cost_cap_reached());
  EXPECT_EQ(st.cost_cap_reason(), ended.reason());
  EXPECT_EQ(st.cost_cap_remaining_s(), 0);
  EXPECT_THAT(st.last_action(), HasSubstr("command: exit code 0 (cost cap $235.00 reached"));
  EXPECT_EQ(Fired(record), 1);
}

TEST(AutoStopE2eTest, MaxCostWithoutAPriceIsRefusedAtStart) {
  TempDir dir;
  CommandResult r = RunCommand({SftdPath(), "start", "--data-dir", dir.path() + "/data", "--port", "0",
                                "--gpus", "none", "--max-cost", "25"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output,
              AllOf(HasSubstr("SFTD_ERROR"), HasSubstr("--max-cost"), HasSubstr("--price-per-hour")));
}

// `sftd start` with --stop-* flags while an agent runs (the client started it without them) restarts
// it, so the flags take effect.
TEST(AutoStopE2eTest, StopFlagsGivenToARunningAgentRestartIt) {
  TempDir dir;
  const std::string data = dir.path() + "/data", record = dir.path() + "/record";
  const std::vector<std::string> base = {SftdPath(), "start",  "--detach", "--data-dir", data,      "--port",
                                         "0",        "--gpus", "none",     "--trainer",  StubPath()};
  struct StopAgent {
    std::string dir;
    ~StopAgent() { RunCommand({SftdPath(), "stop", "--data-dir", dir}); }
  } stop_agent{data};
  CommandResult first = RunForStdout(base);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  std::vector<std::string> with_flags = base;
  for (const std::string& f : StopFlags(record, "1s")) with_flags.push_back(f);
  CommandResult second = RunCommand(with_flags);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_THAT(second.output, HasSubstr("to apply the --stop-* flags"));
  EXPECT_NE(first.output, second.output.substr(second.output.find("SFTD_READY")));  // another pid
  ASSERT_TRUE(WaitFor([&] { return Fired(record) == 1; }));
  // Without flags, the running agent (and its policy) is kept.
  CommandResult third = RunForStdout(base);
  ASSERT_EQ(third.exit_code, 0) << third.output;
  EXPECT_EQ(third.output, second.output.substr(second.output.find("SFTD_READY")));
}

}  // namespace
}  // namespace sftctl::agent::testing
