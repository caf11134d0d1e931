// The stop policy: DecideStop (pure) and AutoStop in-process with a real StateStore, a clock the test
// moves (tests/util/offset_clock.h) and a recording CommandRunner, so no test waits for a grace.
#include "agent/stopping/auto_stop.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include "agent/stopping/stop_action.h"
#include "tests/agent/agent_test_util.h"
#include "tests/util/offset_clock.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"

namespace sftctl::agent {
namespace {

using namespace std::chrono_literals;
using ::sftctl::agent::testing::WaitFor;
using ::sftctl::testing::OffsetClock;
using ::sftctl::testing::StatusIs;
using ::sftctl::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// ---- DecideStop ---------------------------------------------------------------------------------

StopInputs Quiet(std::chrono::seconds for_how_long) {
  StopInputs in;
  in.now = Clock::TimePoint(10000h);
  in.quiet_since = in.now - for_how_long;
  return in;
}

StopPolicy Idle(int64_t idle_s) {
  StopPolicy p;
  p.idle_s = idle_s;
  p.action = "command";
  p.command = "true";
  return p;
}

TEST(DecideStopTest, OffWithoutIdlePolicyOrStopWhenDoneJob) {
  StopDecision d = DecideStop(StopPolicy(), Quiet(100h));
  EXPECT_EQ(d.verdict, StopVerdict::kOff);
}

TEST(DecideStopTest, CountsDownTheIdleTimeThenStops) {
  StopDecision d = DecideStop(Idle(3600), Quiet(1000s));
  EXPECT_EQ(d.verdict, StopVerdict::kCountdown);
  EXPECT_EQ(d.remaining_s, 2600);
  EXPECT_EQ(d.why, "quiet for 16m40s of 1h00m");
  d = DecideStop(Idle(3600), Quiet(3600s));
  EXPECT_EQ(d.verdict, StopVerdict::kStopNow);
  EXPECT_EQ(d.why, "idle for 1h00m");
}

TEST(DecideStopTest, ActiveJobsAndOpenCallsKeepItBusy) {
  StopInputs in = Quiet(100h);
  in.active_jobs = 2;
  StopDecision d = DecideStop(Idle(60), in);
  EXPECT_EQ(d.verdict, StopVerdict::kBusy);
  EXPECT_EQ(d.why, "2 job(s) running or queued");
  in.active_jobs = 0;
  in.open_calls = 1;
  d = DecideStop(Idle(60), in);
  EXPECT_EQ(d.verdict, StopVerdict::kBusy);
  EXPECT_EQ(d.why, "1 client call(s) open");
}

TEST(DecideStopTest, StopWhenDoneUsesTheShorterGraceAndWaitsForThePull) {
  StopPolicy p = Idle(0);
  p.grace_s = 60;
  p.pull_timeout_s = 600;
  StopInputs in = Quiet(30s);
  in.waiting_jobs = 1;
  in.active_jobs = 1;
  EXPECT_EQ(DecideStop(p, in).verdict, StopVerdict::kBusy);
  in.waiting_jobs = 0;
  in.active_jobs = 0;
  in.work_done = true;
  StopDecision d = DecideStop(p, in);
  EXPECT_EQ(d.verdict, StopVerdict::kCountdown);
  EXPECT_EQ(d.remaining_s, 30);
  in = Quiet(61s);
  in.work_done = true;
  in.unpulled = {"job-3"};
  in.pull_wait_since = in.now - 100s;
  d = DecideStop(p, in);
  EXPECT_EQ(d.verdict, StopVerdict::kAwaitPull);
  EXPECT_EQ(d.remaining_s, 500);
  EXPECT_THAT(d.why, HasSubstr("job-3: final checkpoint not pulled"));
  in.pull_wait_since = in.now - 600s;
  d = DecideStop(p, in);
  EXPECT_EQ(d.verdict, StopVerdict::kStopNow);
  EXPECT_THAT(d.why, HasSubstr("gave up waiting for the pull of job-3"));
  // With an idle policy too, the shorter of the two graces applies after a stop-when-done job.
  p.idle_s = 7200;
  in = Quiet(61s);
  in.work_done = true;
  EXPECT_EQ(DecideStop(p, in).verdict, StopVerdict::kStopNow);
}

TEST(StopPolicyTest, ActionsAndValidation) {
  StopPolicy p;
  StopEnv none, runpod, lambda;
  runpod.runpod = true;
  lambda.lambda = true;
  EXPECT_EQ(ResolveAction(p, none), "");
  EXPECT_EQ(ResolveAction(p, runpod), "runpod");
  EXPECT_EQ(ResolveAction(p, lambda), "lambda");
  EXPECT_THAT(ActionCommand("", p), StatusIs(StatusCode::kFailedPrecondition, HasSubstr("--stop-action")));
  EXPECT_THAT(*ActionCommand("runpod", p), HasSubstr("runpodctl stop pod \"$RUNPOD_POD_ID\""));
  EXPECT_THAT(*ActionCommand("runpod-terminate", p), HasSubstr("runpodctl remove pod \"$RUNPOD_POD_ID\""));
  p.action = "runpod-terminate";
  EXPECT_TRUE(ValidateStopPolicy(p).ok());
  p.action = "";
  // Lambda's is no shell command: its key would be on curl's command line (LambdaTerminateRequest below).
  EXPECT_THAT(ActionCommand("lambda", p),
              StatusIs(StatusCode::kInternal, HasSubstr("agent/stopping/stop_action.h")));
  EXPECT_THAT(*ActionCommand("shutdown", p), HasSubstr("sudo -n shutdown -h now"));
  p.action = "reboot";
  EXPECT_THAT(ValidateStopPolicy(p), StatusIs(StatusCode::kInvalidArgument, HasSubstr("--stop-action")));
  p.action = "command";
  EXPECT_THAT(ValidateStopPolicy(p), StatusIs(StatusCode::kInvalidArgument, HasSubstr("--stop-command")));
  StopPolicyFlags f;
  f.command = "touch /tmp/x";
  p = ApplyStopFlags(StopPolicy(), f);
  EXPECT_EQ(p.action, "command");
  EXPECT_EQ(*ActionCommand("command", p), "touch /tmp/x");
  EXPECT_TRUE(StorageSurvives(StopPolicy(), "/workspace/sftd", runpod));
  EXPECT_FALSE(StorageSurvives(StopPolicy(), "/workspace/sftd", none));
  EXPECT_FALSE(StorageSurvives(StopPolicy(), "/root/.local/share/sftd", runpod));
  EXPECT_TRUE(StorageSurvives(StopPolicy(), "/lambda/nfs/fs1/sftd", none));
  EXPECT_EQ(FormatDuration(45), "45s");
  EXPECT_EQ(FormatDuration(7260), "2h01m");
  EXPECT_EQ(FormatDuration(90000), "1d01h");
}

// ---- The cost cap (DecideCostCap) ----------------------------------------------------------------

constexpr int64_t kBillingSince = 1000000000;  // 2001-09-09T01:46:40Z

StopPolicy Capped(double price, double max_cost) {
  StopPolicy p;
  p.price_per_hour = price;
  p.max_cost = max_cost;
  p.billing_since_unix_s = kBillingSince;
  return p;
}

int64_t UnixMsAfter(std::chrono::milliseconds since_billing) {
  return kBillingSince * 1000 + since_billing.count();
}

TEST(DecideCostCapTest, JustBelowAtAndPastTheCap) {
  const StopPolicy p = Capped(2.0, 10.0);  // $10 is 5 hours
  CostCap c = DecideCostCap(p, UnixMsAfter(4h), /*lead_s=*/0);
  EXPECT_TRUE(c.on);
  EXPECT_FALSE(c.reached);
  EXPECT_DOUBLE_EQ(c.spent, 8.0);
  EXPECT_EQ(c.remaining_s, 3600);
  c = DecideCostCap(p, UnixMsAfter(5h - 1ms), 0);
  EXPECT_FALSE(c.reached);
  EXPECT_EQ(c.remaining_s, 0);
  EXPECT_EQ(c.why, "");
  c = DecideCostCap(p, UnixMsAfter(5h), 0);
  EXPECT_TRUE(c.reached);
  EXPECT_EQ(c.remaining_s, 0);
  EXPECT_EQ(c.why, "cost cap $10.00 reached: $10.00 spent at $2.00/h since 2001-09-09T01:46:40Z");
  c = DecideCostCap(p, UnixMsAfter(6h), 0);
  EXPECT_TRUE(c.reached);
  EXPECT_EQ(c.why, "cost cap $10.00 reached: $12.00 spent at $2.00/h since 2001-09-09T01:46:40Z");
}

// The lead (the time the agent needs to stop) comes off the end: reached 10 minutes early.
TEST(DecideCostCapTest, TheLeadStopsItEarly) {
  const StopPolicy p = Capped(2.0, 10.0);
  CostCap c = DecideCostCap(p, UnixMsAfter(4h + 49min + 59s), /*lead_s=*/600);
  EXPECT_FALSE(c.reached);
  EXPECT_EQ(c.remaining_s, 1);
  c = DecideCostCap(p, UnixMsAfter(4h + 50min), 600);
  EXPECT_TRUE(c.reached);
  EXPECT_EQ(c.why, "cost cap $10.00 reached: $9.67 spent at $2.00/h since 2001-09-09T01:46:40Z");
}

TEST(DecideCostCapTest, OffWithoutCapPriceOrBillingStart) {
  StopPolicy p = Capped(2.0, 0);  // cap 0: off, but the spend is known
  CostCap c = DecideCostCap(p, UnixMsAfter(100h), 0);
  EXPECT_FALSE(c.on);
  EXPECT_FALSE(c.reached);
  EXPECT_DOUBLE_EQ(c.spent, 200.0);
  p = Capped(0, 10.0);  // no price
  c = DecideCostCap(p, UnixMsAfter(100h), 0);
  EXPECT_FALSE(c.on);
  EXPECT_FALSE(c.reached);
  EXPECT_EQ(c.spent, 0);
  p = Capped(2.0, 10.0);
  p.billing_since_unix_s = 0;  // unknown
  EXPECT_FALSE(DecideCostCap(p, UnixMsAfter(100h), 0).on);
  // A billing start in the future (a skewed clock) is nothing spent yet.
  p = Capped(2.0, 10.0);
  c = DecideCostCap(p, UnixMsAfter(-1h), 0);
  EXPECT_FALSE(c.reached);
  EXPECT_EQ(c.spent, 0);
  EXPECT_EQ(c.remaining_s, 5 * 3600);
}

// The cap comes before everything: running jobs and open calls do not hold a host past it.
TEST(DecideStopTest, TheCostCapStopsABusyHost) {
  StopInputs in = Quiet(0s);
  in.active_jobs = 2;
  in.open_calls = 1;
  in.now_unix_ms = UnixMsAfter(5h);
  StopDecision d = DecideStop(Capped(2.0, 10.0), in);
  EXPECT_EQ(d.verdict, StopVerdict::kCostCap);
  EXPECT_EQ(d.why, "cost cap $10.00 reached: $10.00 spent at $2.00/h since 2001-09-09T01:46:40Z");
  EXPECT_STREQ(StopVerdictName(d.verdict), "cost_cap");
  in.now_unix_ms = UnixMsAfter(4h);
  d = DecideStop(Capped(2.0, 10.0), in);
  EXPECT_EQ(d.verdict, StopVerdict::kOff);  // no idle policy, no stop-when-done job
  EXPECT_EQ(d.cap.remaining_s, 3600);
  in.cost_lead_s = 3600;  // the lead is DecideStop's input too
  EXPECT_EQ(DecideStop(Capped(2.0, 10.0), in).verdict, StopVerdict::kCostCap);
}

TEST(StopPolicyTest, CostCapValidationAndDescription) {
  StopPolicy p = Capped(2.0, -1);
  EXPECT_THAT(ValidateStopPolicy(p),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("--max-cost: must not be negative")));
  p = Capped(0, 25);
  EXPECT_THAT(ValidateStopPolicy(p), StatusIs(StatusCode::kInvalidArgument,
                                              AllOf(HasSubstr("--max-cost"), HasSubstr("--price-per-hour"))));
  p = Capped(2.0, 25);
  p.billing_since_unix_s = -5;
  EXPECT_THAT(ValidateStopPolicy(p), StatusIs(StatusCode::kInvalidArgument, HasSubstr("--billing-since")));
  p = Capped(2.49, 25);
  EXPECT_TRUE(ValidateStopPolicy(p).ok());
  EXPECT_EQ(DescribeStopPolicy(p, ""),
            "stop 1m00s after a stop-when-done job; action none; $2.49/h; cost cap $25.00");
  EXPECT_EQ(DescribeStopPolicy(Capped(2.49, 0), ""), "");
  EXPECT_EQ(StopPolicyFromJson(StopPolicyToJson(p)).max_cost, 25);
  EXPECT_EQ(StopPolicyFromJson(StopPolicyToJson(p)).billing_since_unix_s, kBillingSince);
  EXPECT_EQ(FormatUtc(kBillingSince), "2001-09-09T01:46:40Z");
}

// ---- AutoStop ------------------------------------------------------------------------------------

// Records every command instead of running it; answers with `exit_code`.
class RecordingRunner : public CommandRunner {
 public:
  StatusOr<CommandOutcome> Run(const std::string& command, std::chrono::seconds) override {
    commands.push_back(command);
    CommandOutcome out;
    out.exit_code = exit_code;
    out.output = "recorded";
    return out;
  }
  std::vector<std::string> commands;
  int exit_code = 0;
};

class AutoStopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = StateStore::Open(dir_.path() + "/agent.db");
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  // The fixture's store, activity, job count, runner and clock.
  AutoStopDeps Deps() {
    AutoStopDeps deps;
    deps.store = store_.get();
    deps.activity = &activity_;
    deps.active_jobs = [this] { return active_.load(); };
    deps.runner = &runner_;
    deps.clock = &clock_;
    deps.data_dir = dir_.path();
    return deps;
  }
  std::unique_ptr<AutoStop> Make(StopPolicy policy) { return std::make_unique<AutoStop>(Deps(), policy); }
  // A stop-when-done job in `state` with complete checkpoints at `steps`.
  JobRecord AddJob(JobState state, const std::vector<int>& steps) {
    JobRecord rec;
    rec.stop_when_done = true;
    rec.job_dir = dir_.path() + "/jobs/";
    rec.spec_json = "{}";
    auto ins = store_->InsertJob(rec);
    EXPECT_TRUE(ins.ok());
    rec = *ins;
    rec.state = state;
    EXPECT_TRUE(store_->SaveJob(rec, nullptr).ok());
    for (int s : steps) {
      char name[32];
      std::snprintf(name, sizeof(name), "checkpoint-%06d", s);
      std::filesystem::create_directories(rec.job_dir + "/run/" + name);
      std::ofstream(rec.job_dir + "/run/" + name + "/DONE") << "ok\n";
    }
    return rec;
  }

  TempDir dir_;
  OffsetClock clock_;
  std::unique_ptr<StateStore> store_;
  ClientActivity activity_{&clock_};
  std::atomic<uint32_t> active_{0};
  RecordingRunner runner_;
};

// Each test below moves the clock past the point where a stop would be due, several periods over,
// and counts the recorded actions: what must not happen is checked at once, with no real waiting.
TEST_F(AutoStopTest, IdleFiresOnceAfterTheGraceAndNeverAgain) {
  auto stop = Make(Idle(600));
  EXPECT_EQ(stop->CheckOnce().verdict, StopVerdict::kCountdown);
  clock_.Advance(599s);
  StopDecision d = stop->CheckOnce();
  EXPECT_EQ(d.verdict, StopVerdict::kCountdown);
  EXPECT_EQ(d.remaining_s, 1);
  EXPECT_TRUE(runner_.commands.empty());
  clock_.Advance(2s);
  EXPECT_EQ(stop->CheckOnce().verdict, StopVerdict::kStopNow);
  ASSERT_EQ(runner_.commands, std::vector<std::string>{"true"});
  EXPECT_EQ(stop->View().state, "stopped");
  EXPECT_THAT(stop->View().last_action, HasSubstr("command: exit code 0 (idle for 10m00s)"));
  for (int period = 0; period < 3; ++period) {  // more than two idle periods later: still once
    clock_.Advance(601s);
    stop->CheckOnce();
    EXPECT_EQ(stop->View().state, "stopped");
  }
  clock_.Advance(2h);
  stop->CheckOnce();
  EXPECT_EQ(runner_.commands.size(), 1u);  // once
  EXPECT_EQ(stop->fired(), 1);
}

TEST_F(AutoStopTest, RunningJobPostponesAndItsEndRestartsTheCountdown) {
  auto stop = Make(Idle(600));
  active_ = 1;
  for (int period = 0; period < 3; ++period) {  // each check is past the idle grace
    clock_.Advance(601s);
    EXPECT_EQ(stop->CheckOnce().verdict, StopVerdict::kBusy);
    EXPECT_EQ(stop->View().state, "busy");
    EXPECT_EQ(stop->View().detail, "1 job(s) running or queued");
  }
  clock_.Advance(2h);
  EXPECT_EQ(stop->CheckOnce().verdict, StopVerdict::kBusy);
  EXPECT_TRUE(runner_.commands.empty());
  active_ = 0;
  StopDecision d = stop->CheckOnce();
  EXPECT_EQ(d.verdict, StopVerdict::kCountdown);
  EXPECT_EQ(d.remaining_s, 600);  // counted from the last moment a job was seen
  clock_.Advance(601s);
  EXPECT_EQ(stop->CheckOnce().verdict, StopVerdict::kStopNow);
  EXPECT_EQ(runner_.commands.size(), 1u);
}

TEST_F(AutoStopTest, OpenLogsFollowPostponesAndClientContactRenewsTheLease) {
  auto stop = Make(Idle(600));
  activity_.CallStarted();  // a `logs -f` stream
  for (int period = 0; period < 3; ++period) {
    clock_.Advance(601s);
    EXPECT_EQ(stop->CheckOnce().verdict, StopVerdict::kBusy);
    EXPECT_EQ(stop->View().detail, "1 client call(s) open");
  }
  clock_.Advance(2h);
  EXPECT_EQ(stop->CheckOnce().verdict, StopVerdict::kBusy);
  EXPECT_TRUE(runner_.commands.empty());
  activity_.CallEnded();
  clock_.Advance(500s);
  EXPECT_EQ(stop->CheckOnce().remaining_s, 100);
  activity_.CallStarted();  // `sftctl status`: a unary call renews the lease
  activity_.CallEnded();
  clock_.Advance(200s);
  StopDecision d = stop->CheckOnce();
  EXPECT_EQ(d.verdict, StopVerdict::kCountdown);
  EXPECT_EQ(d.remaining_s, 400);
  EXPECT_TRUE(runner_.commands.empty());
  clock_.Advance(400s);
  EXPECT_EQ(stop->CheckOnce().verdict, StopVerdict::kStopNow);
  EXPECT_EQ(runner_.commands.size(), 1u);
}

// The checking thread evaluates on the injected clock every `check` of real time: moved past the
// grace, the action runs at the next check, once.
TEST_F(AutoStopTest, TheCheckingThreadFiresOnceOnTheInjectedClock) {
  AutoStopDeps deps = Deps();
  deps.check = 10ms;
  AutoStop stop(deps, Idle(600));
  stop.Start();
  EXPECT_TRUE(WaitFor([&] { return stop.View().state == "countdown"; }));
  clock_.Advance(601s);
  EXPECT_TRUE(WaitFor([&] { return stop.fired() == 1; }));
  EXPECT_TRUE(WaitFor([&] { return stop.View().state == "stopped"; }));
  clock_.Advance(2h);
  stop.CheckOnce();  // a full evaluation after the move, whatever the thread did meanwhile
  stop.Stop();       // joined: its writes to the runner are visible here
  EXPECT_EQ(runner_.commands, std::vector<std::string>{"true"});
  EXPECT_EQ(stop.fired(), 1);
}

TEST_F(AutoStopTest, FailedActionIsRetriedOnlyAfterAnotherGrace) {
  runner_.exit_code = 3;
  auto stop = Make(Idle(600));
  clock_.Advance(601s);
  stop->CheckOnce();
  ASSERT_EQ(runner_.commands.size(), 1u);
  EXPECT_THAT(stop->View().last_action, HasSubstr("exit code 3"));
  EXPECT_EQ(stop->CheckOnce().verdict, StopVerdict::kCountdown);
  clock_.Advance(300s);
  stop->CheckOnce();
  EXPECT_EQ(runner_.commands.size(), 1u);
  runner_.exit_code = 0;
  clock_.Advance(301s);
  stop->CheckOnce();
  EXPECT_EQ(runner_.commands.size(), 2u);
  EXPECT_EQ(stop->fired(), 1);
  // The outcome is stored for a restarted agent's status.
  auto last = store_->GetSetting("auto_stop.last_action");
  ASSERT_TRUE(last.ok() && last->has_value());
  EXPECT_THAT(**last, HasSubstr("\"ok\":true"));
}

TEST_F(AutoStopTest, StopWhenDoneWaitsForThePullOfTheNewestCompleteCheckpoint) {
  StopPolicy p = Idle(0);
  p.grace_s = 60;
  p.storage = "lost";
  JobRecord running = AddJob(JobState::RUNNING, {});
  auto stop = Make(p);
  active_ = 1;
  EXPECT_EQ(stop->CheckOnce().verdict, StopVerdict::kBusy);
  running.state = JobState::SUCCEEDED;
  ASSERT_TRUE(store_->SaveJob(running, nullptr).ok());
  std::filesystem::create_directories(running.job_dir + "/run/checkpoint-000002");
  std::filesystem::create_directories(running.job_dir + "/run/checkpoint-000004");
  std::ofstream(running.job_dir + "/run/checkpoint-000002/DONE") << "ok\n";
  std::ofstream(running.job_dir + "/run/checkpoint-000004/DONE") << "ok\n";
  std::filesystem::create_directories(running.job_dir + "/run/checkpoint-000006");  // incomplete
  active_ = 0;
  EXPECT_EQ(stop->CheckOnce().verdict, StopVerdict::kCountdown);
  for (int period = 0; period < 3; ++period) {  // each check is past the grace
    clock_.Advance(61s);
    StopDecision d = stop->CheckOnce();
    EXPECT_EQ(d.verdict, StopVerdict::kAwaitPull);
    EXPECT_GT(d.remaining_s, 1500);  // of the default 30 minutes' wait for the pull
    EXPECT_EQ(stop->View().state, "await_pull");
    EXPECT_EQ(stop->View().detail, running.id + ": final checkpoint not pulled yet (`sftctl pull`)");
  }
  activity_.NotePulled(running.id, "run/checkpoint-000002/DONE");  // an older one does not count
  EXPECT_EQ(stop->CheckOnce().verdict, StopVerdict::kAwaitPull);
  EXPECT_TRUE(runner_.commands.empty());
  activity_.NotePulled(running.id, "run/checkpoint-000004/DONE");
  EXPECT_EQ(stop->CheckOnce().verdict, StopVerdict::kStopNow);
  EXPECT_EQ(runner_.commands.size(), 1u);
  // Consumed: a restarted agent does not stop again for this job.
  auto left = store_->StopWhenDoneJobs();
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty());
  EXPECT_EQ(Make(p)->CheckOnce().verdict, StopVerdict::kOff);
}

TEST_F(AutoStopTest, StopWhenDoneGivesUpOnThePullAfterTheTimeout) {
  StopPolicy p = Idle(0);
  p.grace_s = 60;
  p.pull_timeout_s = 1800;
  p.storage = "lost";
  AddJob(JobState::FAILED, {3});
  auto stop = Make(p);
  clock_.Advance(61s);
  StopDecision d = stop->CheckOnce();
  EXPECT_EQ(d.verdict, StopVerdict::kAwaitPull);
  EXPECT_EQ(d.remaining_s, 1800);
  EXPECT_EQ(stop->View().state, "await_pull");
  clock_.Advance(1800s);
  EXPECT_EQ(stop->CheckOnce().verdict, StopVerdict::kStopNow);
  EXPECT_EQ(runner_.commands.size(), 1u);
}

TEST_F(AutoStopTest, SurvivingStorageNeedsNoPull) {
  StopPolicy p = Idle(0);
  p.grace_s = 60;
  p.storage = "survives";
  AddJob(JobState::SUCCEEDED, {3});
  auto stop = Make(p);
  clock_.Advance(61s);
  EXPECT_EQ(stop->CheckOnce().verdict, StopVerdict::kStopNow);
  EXPECT_EQ(runner_.commands.size(), 1u);
}

TEST_F(AutoStopTest, ThePolicyOutlivesARestartAndFlagsChangeIt) {
  StopPolicyFlags f;
  f.idle_s = 7200;
  f.command = "echo stop";
  f.price_per_hour = 1.5;
  auto p = LoadStopPolicy(store_.get(), f, StopEnv());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto again = LoadStopPolicy(store_.get(), StopPolicyFlags(), StopEnv());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->idle_s, 7200);
  EXPECT_EQ(again->command, "echo stop");
  EXPECT_EQ(again->action, "command");
  EXPECT_EQ(Make(*again)->View().policy,
            "stop when idle 2h00m, or 1m00s after a stop-when-done job; action command; $1.50/h");
  StopPolicyFlags off;
  off.idle_s = 0;
  ASSERT_TRUE(LoadStopPolicy(store_.get(), off, StopEnv()).ok());
  EXPECT_EQ(LoadStopPolicy(store_.get(), StopPolicyFlags(), StopEnv())->idle_s, 0);
  // Arming an idle stop with no action anywhere is refused at start.
  TempDir other;
  auto fresh = StateStore::Open(other.path() + "/agent.db");
  ASSERT_TRUE(fresh.ok());
  StopPolicyFlags idle_only;
  idle_only.idle_s = 60;
  EXPECT_THAT(LoadStopPolicy(fresh->get(), idle_only, StopEnv()),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("no stop action")));
  StopEnv runpod;
  runpod.runpod = true;
  EXPECT_TRUE(LoadStopPolicy(fresh->get(), idle_only, runpod).ok());
}

// Once the action runs, a job submission is refused with the reason, and stays refused once it
// succeeded (the host is going away); a failed action re-arms, and submissions are welcome again.
TEST_F(AutoStopTest, SubmissionsAreRefusedOnceStoppingHasBegun) {
  std::unique_ptr<AutoStop> stop;
  struct SubmittingRunner : RecordingRunner {
    std::function<void()> during;
    StatusOr<CommandOutcome> Run(const std::string& command, std::chrono::seconds t) override {
      during();
      return RecordingRunner::Run(command, t);
    }
  } runner;
  Status during_action;
  runner.during = [&] { during_action = stop->AdmitSubmission().status(); };
  runner.exit_code = 3;
  AutoStopDeps deps = Deps();
  deps.runner = &runner;
  stop = std::make_unique<AutoStop>(deps, Idle(600));
  ASSERT_TRUE(stop->AdmitSubmission().ok());  // released at once: the job was not created
  clock_.Advance(601s);
  stop->CheckOnce();
  ASSERT_EQ(runner.commands.size(), 1u);
  EXPECT_THAT(
      during_action,
      StatusIs(StatusCode::kFailedPrecondition,
               HasSubstr("the host is stopping (auto-stop: idle for 10m00s); submit to another host")));
  EXPECT_TRUE(stop->AdmitSubmission().ok()) << "the action failed: the host stays";
  runner.exit_code = 0;
  clock_.Advance(601s);
  stop->CheckOnce();
  ASSERT_EQ(runner.commands.size(), 2u);
  EXPECT_THAT(stop->AdmitSubmission(),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("the host is stopping")));
}

// A submission admitted before the decision holds the host while its job is created; once the job is
// counted as queued, that holds it. (An acknowledged job is never lost with the host.)
TEST_F(AutoStopTest, AnAdmittedSubmissionHoldsTheHostUntilItsJobIsCounted) {
  auto stop = Make(Idle(600));
  auto admitted = stop->AdmitSubmission();
  ASSERT_TRUE(admitted.ok());
  clock_.Advance(601s);
  StopDecision d = stop->CheckOnce();
  EXPECT_EQ(d.verdict, StopVerdict::kBusy);
  EXPECT_TRUE(runner_.commands.empty());
  active_ = 1;        // the job is queued ...
  admitted->reset();  // ... and then the submission answered
  clock_.Advance(601s);
  EXPECT_EQ(stop->CheckOnce().verdict, StopVerdict::kBusy);
  active_ = 0;  // it ended: a full idle period from here
  EXPECT_EQ(stop->CheckOnce().remaining_s, 600);
  EXPECT_TRUE(runner_.commands.empty());
}

// The race the decision must not lose: a job submitted (and acknowledged) after the snapshot was taken
// but before the action begins. The decision reads the jobs again where submissions are admitted, so
// it does not fire. (Before, the action ran and the acknowledged job was lost with the host.)
TEST_F(AutoStopTest, AJobSubmittedBetweenTheSnapshotAndTheActionPreventsIt) {
  std::atomic<int> reads{0};
  AutoStopDeps deps = Deps();
  deps.active_jobs = [&reads]() -> uint32_t { return reads++ == 0 ? 0 : 1; };  // queued after the 1st read
  AutoStop stop(deps, Idle(600));
  clock_.Advance(601s);
  StopDecision d = stop.CheckOnce();
  EXPECT_TRUE(runner_.commands.empty());
  EXPECT_EQ(d.verdict, StopVerdict::kBusy);
  EXPECT_EQ(stop.View().state, "busy");
}

// ---- The cost cap in AutoStop ---------------------------------------------------------------------

// $3600/h is $1 a second; the lead with the default deps is 5 s (check) + 10 s (job stop) + 120 s
// (action) = 135 s. The wall time and the clock are the test's (ManualClock): every amount is exact.
class CostCapTest : public AutoStopTest {
 protected:
  AutoStopDeps CapDeps() {
    AutoStopDeps deps = Deps();
    deps.clock = &manual_;
    deps.unix_ms_at_start = (kBillingSince + 100) * 1000;  // $100 spent
    deps.cancel_jobs = [this](const std::string& reason) -> size_t {
      cancels.push_back(reason);
      return active_.load();
    };
    return deps;
  }
  static StopPolicy Cap(double max_cost) {
    StopPolicy p = Capped(3600, max_cost);
    p.action = "command";
    p.command = "true";
    return p;
  }
  ::sftctl::testing::ManualClock manual_;
  std::vector<std::string> cancels;
};

TEST_F(CostCapTest, ARunningJobIsCancelledWithTheReasonAndTheActionFiresOnce) {
  AutoStop stop(CapDeps(), Cap(1000));  // reached at 865 s since billing began
  active_ = 1;                          // a running job
  EXPECT_EQ(stop.CheckOnce().verdict, StopVerdict::kOff);
  AutoStopView v = stop.View();
  EXPECT_EQ(v.max_cost, 1000);
  EXPECT_DOUBLE_EQ(v.spent, 100);
  EXPECT_EQ(v.cap_remaining_s, 765);
  EXPECT_FALSE(v.cap_reached);
  manual_.Advance(764s);
  EXPECT_EQ(stop.CheckOnce().verdict, StopVerdict::kOff);
  EXPECT_EQ(stop.View().cap_remaining_s, 1);
  EXPECT_TRUE(cancels.empty());
  ASSERT_TRUE(stop.AdmitSubmission().ok());
  manual_.Advance(1s);
  const std::string reason =
      "cost cap $1000.00 reached: $865.00 spent at $3600.00/h since 2001-09-09T01:46:40Z";
  EXPECT_EQ(stop.CheckOnce().verdict, StopVerdict::kCostCap);
  ASSERT_EQ(cancels, std::vector<std::string>{reason});
  EXPECT_TRUE(runner_.commands.empty()) << "the cancelled job has not ended yet";
  v = stop.View();
  EXPECT_EQ(v.state, "stopping");
  EXPECT_TRUE(v.cap_reached);
  EXPECT_EQ(v.cap_reason, reason);
  EXPECT_EQ(v.cap_remaining_s, 0);
  EXPECT_THAT(stop.AdmitSubmission(),
              StatusIs(StatusCode::kFailedPrecondition,
                       "the host is stopping (" + reason + "); submit to another host"));
  active_ = 0;  // the job ended (CANCELLED)
  manual_.Advance(5s);
  EXPECT_EQ(stop.CheckOnce().verdict, StopVerdict::kCostCap);
  ASSERT_EQ(runner_.commands, std::vector<std::string>{"true"});
  EXPECT_EQ(stop.View().state, "stopped");
  EXPECT_THAT(stop.View().last_action, HasSubstr("command: exit code 0 (cost cap $1000.00 reached"));
  for (int i = 0; i < 3; ++i) {  // hours past the cap: once
    manual_.Advance(1h);
    EXPECT_EQ(stop.CheckOnce().verdict, StopVerdict::kCostCap);
  }
  EXPECT_EQ(runner_.commands.size(), 1u);
  EXPECT_EQ(cancels.size(), 1u) << "no job was active again: nothing more to cancel";
  EXPECT_EQ(stop.fired(), 1);
  EXPECT_THAT(stop.AdmitSubmission(), StatusIs(StatusCode::kFailedPrecondition, HasSubstr(reason)));
}

// A job that does not end holds the action at most job_stop_time + check; a job queued after the
// cancel (a submission admitted just before the cap) is cancelled at the next check.
TEST_F(CostCapTest, TheActionWaitsForTheCancelledJobsAtMostTheirStopTime) {
  AutoStop stop(CapDeps(), Cap(235));  // reached at once: 100 + 135 >= 235
  active_ = 2;
  EXPECT_EQ(stop.CheckOnce().verdict, StopVerdict::kCostCap);
  EXPECT_EQ(cancels.size(), 1u);
  manual_.Advance(14s);  // < 10 s + 5 s
  stop.CheckOnce();
  EXPECT_EQ(cancels.size(), 2u) << "a job is still active: cancelled again";
  EXPECT_TRUE(runner_.commands.empty());
  manual_.Advance(1s);
  stop.CheckOnce();
  EXPECT_EQ(runner_.commands.size(), 1u);
  EXPECT_EQ(stop.fired(), 1);
}

TEST_F(CostCapTest, WithoutAStopActionTheJobsAreCancelledAndTheHostKeepsRunning) {
  StopPolicy p = Capped(3600, 235);  // no action, none detected
  AutoStop stop(CapDeps(), p);
  active_ = 1;
  EXPECT_EQ(stop.CheckOnce().verdict, StopVerdict::kCostCap);
  const std::string reason =
      "cost cap $235.00 reached: $100.00 spent at $3600.00/h since 2001-09-09T01:46:40Z; no stop action: the "
      "host keeps running";
  ASSERT_EQ(cancels, std::vector<std::string>{reason});
  active_ = 0;
  manual_.Advance(1h);
  stop.CheckOnce();
  EXPECT_TRUE(runner_.commands.empty());
  AutoStopView v = stop.View();
  EXPECT_EQ(v.state, "no_action");
  EXPECT_EQ(v.detail, reason);
  EXPECT_TRUE(v.cap_reached);
  EXPECT_THAT(stop.AdmitSubmission(), StatusIs(StatusCode::kFailedPrecondition, HasSubstr(reason)));
}

TEST_F(CostCapTest, AFailedActionIsRetriedAfterCapRetryAndSubmissionsStayRefused) {
  runner_.exit_code = 3;
  AutoStop stop(CapDeps(), Cap(235));
  stop.CheckOnce();
  ASSERT_EQ(runner_.commands.size(), 1u);
  EXPECT_THAT(stop.AdmitSubmission(),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("cost cap $235.00")));
  manual_.Advance(299s);
  stop.CheckOnce();
  EXPECT_EQ(runner_.commands.size(), 1u);
  EXPECT_EQ(stop.View().state, "stopping");
  runner_.exit_code = 0;
  manual_.Advance(1s);
  stop.CheckOnce();
  EXPECT_EQ(runner_.commands.size(), 2u);
  EXPECT_EQ(stop.fired(), 1);
  EXPECT_EQ(stop.View().state, "stopped");
}

// --max-cost with the billing start: persisted like the other flags, the start defaulting to the first
// start with a price; a restarted agent with the cap spent refuses submissions before its first check,
// then stops the host again.
TEST_F(CostCapTest, ARestartWithTheCapSpentRefusesAtOnceAndStopsAgain) {
  StopPolicyFlags f;
  f.command = "true";
  f.max_cost = 235;
  EXPECT_THAT(
      LoadStopPolicy(store_.get(), f, StopEnv(), kBillingSince),
      StatusIs(StatusCode::kInvalidArgument, AllOf(HasSubstr("--max-cost"), HasSubstr("--price-per-hour"))));
  f.price_per_hour = 3600;
  auto p = LoadStopPolicy(store_.get(), f, StopEnv(), kBillingSince);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->billing_since_unix_s, kBillingSince);  // this first start
  auto again = LoadStopPolicy(store_.get(), StopPolicyFlags(), StopEnv(), kBillingSince + 5000);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->billing_since_unix_s, kBillingSince) << "a restart keeps counting";
  EXPECT_EQ(again->max_cost, 235);
  {
    AutoStop first(CapDeps(), *again);
    first.CheckOnce();
    EXPECT_EQ(first.fired(), 1);
  }
  // The restarted agent: refused before any check.
  AutoStop restarted(CapDeps(), *again);
  EXPECT_THAT(restarted.AdmitSubmission(), StatusIs(StatusCode::kFailedPrecondition,
                                                    HasSubstr("cost cap $235.00 reached: $100.00 spent")));
  active_ = 1;  // a job recovered by the restarted agent
  EXPECT_EQ(restarted.CheckOnce().verdict, StopVerdict::kCostCap);
  EXPECT_EQ(cancels.size(), 2u);
  active_ = 0;
  restarted.CheckOnce();
  EXPECT_EQ(runner_.commands.size(), 2u);
  EXPECT_EQ(restarted.fired(), 1);
  // --billing-since replaces the start; --max-cost 0 turns the cap off.
  StopPolicyFlags later;
  later.billing_since_unix_s = kBillingSince + 100;
  later.max_cost = 0;
  auto off = LoadStopPolicy(store_.get(), later, StopEnv());
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->billing_since_unix_s, kBillingSince + 100);
  AutoStop uncapped(CapDeps(), *off);
  EXPECT_TRUE(uncapped.AdmitSubmission().ok());
  EXPECT_EQ(uncapped.CheckOnce().verdict, StopVerdict::kOff);
  EXPECT_EQ(cancels.size(), 2u);
}

// The "lambda" action's one request, made by the agent itself: the key in a header (to the API's origin
// only: no redirect is followed), the instance in a JSON body, Lambda's API root when none is set.
TEST(StopActionTest, LambdaTerminateRequestCarriesTheKeyInAHeaderOnly) {
  LambdaApi api{"secret_key", "i-\"1", ""};
  auto req = LambdaTerminateRequest(api, 120s);
  ASSERT_TRUE(req.ok()) << req.status().ToString();
  EXPECT_EQ(req->method, "POST");
  EXPECT_EQ(req->url, "https://cloud.lambda.ai/api/v1/instance-operations/terminate");
  EXPECT_EQ(req->body, R"({"instance_ids":["i-\"1"]})");
  EXPECT_THAT(req->headers, ::testing::Contains(std::make_pair(std::string("Authorization"),
                                                               std::string("Bearer secret_key"))));
  EXPECT_FALSE(req->follow_redirects);
  EXPECT_EQ(req->stall_timeout, 60s);
  api.api_url = "http://127.0.0.1:9/api/v1/";
  EXPECT_EQ(LambdaTerminateRequest(api, 5s)->url, "http://127.0.0.1:9/api/v1/instance-operations/terminate");
  EXPECT_EQ(LambdaTerminateRequest(api, 5s)->stall_timeout, 5s);
  api.api_url = "file:///etc/passwd";
  EXPECT_THAT(LambdaTerminateRequest(api, 5s).status(),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("LAMBDA_API_URL")));
  api = LambdaApi{"", "i-1", ""};
  EXPECT_THAT(LambdaTerminateRequest(api, 5s).status(),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("LAMBDA_API_KEY and LAMBDA_INSTANCE_ID")));
}

// An HttpClient that records the request and answers with `status` and `body`.
class AnsweringHttp : public HttpClient {
 public:
  AnsweringHttp(long status, std::string body) : status_(status), body_(std::move(body)) {}
  StatusOr<HttpResponse> Send(const HttpRequest& req, const HttpSink& sink,
                              const HttpHeadersCheck&) override {
    sent.push_back(req);
    HttpResponse r;
    r.status = status_;
    if (sink && !sink(body_)) return CancelledError("stopped by the sink");
    if (!sink) r.body = body_;
    return r;
  }
  std::vector<HttpRequest> sent;

 private:
  long status_;
  std::string body_;
};

// The lambda action runs no command (the runner is never asked); Lambda's refusal is its outcome, in
// Lambda's words, and the key is in none of it.
TEST(StopActionTest, LambdaRunsNoCommandAndReportsTheApisAnswer) {
  StopEnv env;
  env.lambda_api = {"secret_key", "i-1", "http://127.0.0.1:9/api/v1"};
  AnsweringHttp refused(401,
                        R"({"error": {"code": "global/invalid-api-key", "message": "API key was invalid"}})");
  auto out = RunStopAction("lambda", StopPolicy(), env, /*runner=*/nullptr, &refused, 120s);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_FALSE(out->ok);
  EXPECT_EQ(out->result, "HTTP 401 global/invalid-api-key: API key was invalid");
  ASSERT_EQ(refused.sent.size(), 1u);
  EXPECT_EQ(refused.sent[0].url, "http://127.0.0.1:9/api/v1/instance-operations/terminate");
  AnsweringHttp done(200, R"({"data": {"terminated_instances": []}})");
  out = RunStopAction("lambda", StopPolicy(), env, nullptr, &done, 120s);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(out->ok);
  EXPECT_EQ(out->result, "HTTP 200");
  for (const std::string& text : {out->result, out->output}) EXPECT_THAT(text, Not(HasSubstr("secret_key")));
  AnsweringHttp garbage(502, "<html>\x1b[31mbad gateway</html>");
  out = RunStopAction("lambda", StopPolicy(), env, nullptr, &garbage, 120s);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->result, "HTTP 502");
  EXPECT_THAT(out->output, Not(HasSubstr("\x1b")));  // escaped before a log or `status` shows it
}

// The stop command gets the cloud API variables it uses and the basics, never the other secrets of the
// agent's environment (HF_TOKEN: the host's Hub token).
TEST(CommandRunnerTest, TheCommandGetsOnlyTheStopCommandsEnvironment) {
  const std::vector<std::pair<std::string, std::string>> set = {{"HF_TOKEN", "hf_secret"},
                                                                {"LAMBDA_API_KEY", "lambda_key"},
                                                                {"LAMBDA_INSTANCE_ID", "i-1"},
                                                                {"RUNPOD_POD_ID", "pod-1"},
                                                                {"SFTD_TEST_OTHER", "other"}};
  for (const auto& [k, v] : set) ::setenv(k.c_str(), v.c_str(), 1);
  auto out = CommandRunner::NewPosix(ChildKind::kStopCommand)->Run("env", 30s);
  for (const auto& [k, v] : set) ::unsetenv(k.c_str());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_THAT(out->output, HasSubstr("LAMBDA_API_KEY=lambda_key\n"));
  EXPECT_THAT(out->output, HasSubstr("LAMBDA_INSTANCE_ID=i-1\n"));
  EXPECT_THAT(out->output, HasSubstr("RUNPOD_POD_ID=pod-1\n"));
  EXPECT_THAT(out->output, HasSubstr("PATH="));
  EXPECT_THAT(out->output, ::testing::Not(HasSubstr("HF_TOKEN")));
  EXPECT_THAT(out->output, ::testing::Not(HasSubstr("SFTD_TEST_OTHER")));
}

// Slurm's commands (sbatch, srun, squeue, ...) get the basics only: what they carry may reach a job.
TEST(CommandRunnerTest, SlurmCommandsGetNoCloudKeys) {
  const std::vector<std::pair<std::string, std::string>> set = {{"AWS_SECRET_ACCESS_KEY", "aws_secret"},
                                                                {"LAMBDA_API_KEY", "lambda_key"},
                                                                {"HF_TOKEN", "hf_secret"},
                                                                {"NCCL_DEBUG", "INFO"},
                                                                {"SBATCH_EXPORT", "ALL"}};
  for (const auto& [k, v] : set) ::setenv(k.c_str(), v.c_str(), 1);
  auto out = CommandRunner::NewPosix(ChildKind::kSlurmCommand)->Run("env", 30s);
  for (const auto& [k, v] : set) ::unsetenv(k.c_str());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_THAT(out->output, HasSubstr("PATH="));
  for (const auto& [k, v] : set) EXPECT_THAT(out->output, ::testing::Not(HasSubstr(k))) << out->output;
}

TEST(CommandRunnerTest, RunsTheShellCommandWithItsOutputAndExitCode) {
  auto out = CommandRunner::NewPosix(ChildKind::kStopCommand)->Run("echo out; echo err >&2; exit 4", 30s);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->exit_code, 4);
  EXPECT_EQ(out->output, "out\nerr\n");
  EXPECT_EQ(out->Describe(), "exit code 4");
  out = CommandRunner::NewPosix(ChildKind::kStopCommand)->Run("sleep 30", 1s);
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(out->timed_out);
  EXPECT_EQ(out->Describe(), "timed out after 1 s");
}

}  // namespace
}  // namespace sftctl::agent
