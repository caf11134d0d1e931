// client/remote/job_usage.h: run time from a job's state history (or its latest launch), GPU-hours, the cost
// from the host's price per hour and the job's share of its GPUs, on an injected "now"; and the text
// status prints for a step record's resource fields.
#include "client/remote/job_usage.h"

#include <gtest/gtest.h>

#include "tests/util/status_matchers.h"

namespace sftctl::client {
namespace {

constexpr int64_t kHourMs = 3600 * 1000;
constexpr int64_t kT0 = 1'700'000'000'000;  // unix ms

void Add(v1::Job* job, v1::JobState s, int64_t t) {
  v1::StateChange* c = job->add_history();
  c->set_state(s);
  c->set_time_unix_ms(t);
}

// Queued, ran 1 h, failed, queued again, restarted and has run 30 min by "now".
v1::Job RestartedJob(uint32_t gpus) {
  v1::Job job;
  job.set_gpus(gpus);
  Add(&job, v1::QUEUED, kT0);
  Add(&job, v1::RUNNING, kT0 + 10 * 60 * 1000);
  Add(&job, v1::FAILED, kT0 + 10 * 60 * 1000 + kHourMs);
  Add(&job, v1::QUEUED, kT0 + 2 * kHourMs);
  Add(&job, v1::RUNNING, kT0 + 3 * kHourMs);
  return job;
}

TEST(JobUsage, HistoryCountsEveryRunningIntervalUpToNow) {
  const v1::Job job = RestartedJob(2);
  const JobUsage u =
      ComputeJobUsage(job, kT0 + 3 * kHourMs + 30 * 60 * 1000, /*price=*/16.0, /*host_gpus=*/8);
  EXPECT_DOUBLE_EQ(u.run_hours, 1.5);
  EXPECT_DOUBLE_EQ(u.gpu_hours, 3.0);
  ASSERT_TRUE(u.cost.has_value());
  EXPECT_DOUBLE_EQ(*u.cost, 1.5 * 16.0 * 2 / 8);  // two of the host's eight GPUs
  EXPECT_EQ(UsageText(u), "3.00 GPU-hours, $6.00 at $16.00/h");
  const nlohmann::json j = UsageToJson(u);
  EXPECT_EQ(j["gpu_hours"], 3.0);
  EXPECT_EQ(j["cost"], 6.0);
  EXPECT_EQ(j["price_per_hour"], 16.0);
}

TEST(JobUsage, LaterNowAddsOnlyToTheRunningLaunch) {
  const v1::Job job = RestartedJob(1);
  EXPECT_DOUBLE_EQ(ComputeJobUsage(job, kT0 + 5 * kHourMs, 2.0, 1).run_hours, 3.0);
  v1::Job ended = job;
  Add(&ended, v1::CANCELLING, kT0 + 4 * kHourMs);  // ranks still run while cancelling
  Add(&ended, v1::CANCELLED, kT0 + 4 * kHourMs + 30 * 60 * 1000);
  EXPECT_DOUBLE_EQ(ComputeJobUsage(ended, kT0 + 9 * kHourMs, 2.0, 1).run_hours, 2.5);
}

TEST(JobUsage, WithoutHistoryTheLatestLaunchCounts) {
  v1::Job job;
  job.set_gpus(1);
  EXPECT_EQ(ComputeJobUsage(job, kT0, 2.0, 1).run_hours, 0);  // never started
  job.set_started_unix_ms(kT0);
  EXPECT_DOUBLE_EQ(ComputeJobUsage(job, kT0 + kHourMs / 4, 2.0, 1).run_hours, 0.25);  // running
  job.set_finished_unix_ms(kT0 + kHourMs / 2);
  const JobUsage u = ComputeJobUsage(job, kT0 + 7 * kHourMs, 2.0, 1);
  EXPECT_DOUBLE_EQ(u.run_hours, 0.5);
  EXPECT_DOUBLE_EQ(*u.cost, 1.0);
}

TEST(JobUsage, CpuJobPaysForTheHostAndUnknownPriceHasNoCost) {
  v1::Job job;
  job.set_started_unix_ms(kT0);
  job.set_finished_unix_ms(kT0 + kHourMs);
  JobUsage u = ComputeJobUsage(job, kT0 + kHourMs, 0.5, 4);
  EXPECT_EQ(u.gpu_hours, 0);
  EXPECT_DOUBLE_EQ(*u.cost, 0.5);
  EXPECT_EQ(UsageText(u), "1.00 h on CPU, $0.50 at $0.50/h");
  u = ComputeJobUsage(job, kT0 + kHourMs, 0, 4);
  EXPECT_FALSE(u.cost.has_value());
  EXPECT_TRUE(UsageToJson(u)["cost"].is_null());
  EXPECT_EQ(UsageText(u), "1.00 h on CPU (no --price-per-hour: no cost)");
}

TEST(JobUsage, MoreGpusThanTheHostReportsPaysTheWholeHost) {
  v1::Job job;
  job.set_gpus(4);
  job.set_started_unix_ms(kT0);
  job.set_finished_unix_ms(kT0 + kHourMs);
  EXPECT_DOUBLE_EQ(*ComputeJobUsage(job, kT0 + kHourMs, 10.0, 0).cost, 10.0);  // host GPUs unknown
}

TEST(ResourceSummary, ShowsWhatTheRecordHas) {
  EXPECT_EQ(ResourceSummary({{"event", "step"}, {"loss", 1.0}}), "");
  EXPECT_EQ(ResourceSummary({{"rss_mb", 1536.0}}), " rss 1.50G");
  EXPECT_EQ(ResourceSummary({{"rss_mb", 1024.0},
                             {"gpu_mem_allocated_mb", 10240.0},
                             {"gpu_mem_peak_mb", 12288.0},
                             {"gpu_mem_reserved_mb", 14336.0},
                             {"gpu_util_pct", 87},
                             {"gpu_power_w", 312.5},
                             {"mfu", 0.414}}),
            " rss 1.00G, gpu mem 10.00G (peak 12.00G, reserved 14.00G), util 87%, 312 W, mfu 41.4%");
}

// Issue 37, item 5: `status` aborted (exit 134) on an agent-supplied {"event":7,...} record. The step
// record reader refuses such records with the field named; LatestStepRecord skips them.
TEST(ParseStepRecord, RefusesRecordsOfTheWrongShapeNamingTheField) {
  using ::sftctl::testing::StatusIs;
  auto ok = ParseStepRecord(R"({"event":"step","step":12,"loss":0.5,"rss_mb":1024})");
  ASSERT_TRUE(ok.ok() && ok->has_value()) << ok.status().message();
  EXPECT_EQ((*ok)->step, 12);
  EXPECT_EQ((*ok)->record["rss_mb"], 1024);
  auto other = ParseStepRecord(R"({"event":"eval","step":3,"eval_loss":0.5})");
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->has_value());
  // Issue 49: read by the one event-line reader (common/event_line.h), so a record of any kind with a
  // field of the wrong type is refused, and a step record needs its step.
  EXPECT_THAT(
      ParseStepRecord(R"({"event":"eval","step":"x"})"),
      StatusIs(StatusCode::kInvalidArgument, "metric record: field 'step': expected an integer, got string"));
  EXPECT_THAT(
      ParseStepRecord(R"({"event":"step","loss":0.5})"),
      StatusIs(StatusCode::kInvalidArgument, "metric record: field 'step': missing (expected an integer)"));
  EXPECT_THAT(
      ParseStepRecord(R"({"event":"step","step":2,"loss":"low"})"),
      StatusIs(StatusCode::kInvalidArgument, "metric record: field 'loss': expected a number, got string"));
  EXPECT_THAT(ParseStepRecord(R"({"event":7,"step":1})"),
              StatusIs(StatusCode::kInvalidArgument,
                       "metric record: field 'event': expected a string, got number 7"));
  EXPECT_THAT(
      ParseStepRecord(R"({"event":"step","step":"two"})"),
      StatusIs(StatusCode::kInvalidArgument, "metric record: field 'step': expected an integer, got string"));
  EXPECT_THAT(ParseStepRecord(R"([1])"),
              StatusIs(StatusCode::kInvalidArgument, "metric record: expected a JSON object, got array"));
  EXPECT_EQ(ParseStepRecord("{").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sftctl::client
