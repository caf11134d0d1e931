// What a job has used and cost, and its latest resource figures, for `status`, `list` and the end of
// `logs -f` (docs/observability.md).
//
// Run time is the time the job's ranks ran on this node: every RUNNING/CANCELLING interval of the job's
// state history (GetJob carries it), or, for a job listed without its history (ListJobs), its latest
// launch (started..finished). A launch still running ends at `now_unix_ms`, the caller's clock.
// GPU-hours = run time x the job's GPUs. With the host's price per hour (`sftd --price-per-hour`, in
// HealthResponse.auto_stop), the cost = run time x price x the job's share of the host's GPUs (all of
// it for a CPU job or a host whose GPUs are unknown).
//
// Thread safety: pure functions, except the two that call the agent (like any Reconnector use).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "client/remote/agent_session.h"

namespace sftctl::client {

struct JobUsage {
  double run_hours = 0;
  double gpu_hours = 0;
  double price_per_hour = 0;   // 0: unknown
  std::optional<double> cost;  // with a known price
};

// REQUIRES: `now_unix_ms` >= the job's last state change (earlier is taken as that change).
JobUsage ComputeJobUsage(const v1::Job& job, int64_t now_unix_ms, double price_per_hour, uint32_t host_gpus);
// {"run_hours", "gpu_hours", "price_per_hour", "cost" (null when unknown)}.
nlohmann::json UsageToJson(const JobUsage& u);
// "0.42 GPU-hours, $1.23 at $2.90/h"; a CPU job "0.10 h on CPU"; "(no --price-per-hour)" when unknown.
std::string UsageText(const JobUsage& u);
// The wall clock in unix milliseconds (the callers' `now_unix_ms`).
int64_t WallClockUnixMs();

// The job's usage on its agent (GetJob with history, GetHealth for price and GPUs); nullopt when either
// call fails.
std::optional<JobUsage> FetchJobUsage(Reconnector* rc, const std::string& job_id);

// A "step" metric record ({"event":"step","step":N,...}) and its step.
struct StepRecord {
  int64_t step = 0;
  nlohmann::json record;
};
// One metric event's text as a step record: nullopt for a record of another event. The text is what
// the agent journaled from the trainer, so untrusted: it is read by common/event_line.h's
// ParseEventLine, whose INVALID_ARGUMENT errors (text that is not a JSON object, an "event" that is
// not a string, any field of the wrong type or a negative count, in a record of any kind) are
// returned as they are; a step record without "step" is INVALID_ARGUMENT too.
StatusOr<std::optional<StepRecord>> ParseStepRecord(std::string_view text);

// The newest rank-0 step record among the job's last events (up to `window` before `last_seq`); records
// ParseStepRecord refuses are skipped; nullopt when there is none. Errors: FollowEvents'.
StatusOr<std::optional<StepRecord>> LatestStepRecord(Reconnector* rc, const std::string& job_id,
                                                     uint64_t last_seq, uint64_t window = 64);
// " rss 1.20G, gpu mem 10.50G (peak 12.00G, reserved 14.00G), util 87%, 312 W, mfu 41%": the resource
// fields a step record has (trainer/training/gpu_metrics.h); empty when it has none.
std::string ResourceSummary(const nlohmann::json& step_record);

}  // namespace sftctl::client
