#include "client/remote/job_usage.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "client/remote/host_summary.h"
#include "client/remote/log_follower.h"
#include "common/event_line.h"

namespace sftctl::client {
namespace {

constexpr double kMsPerHour = 3600.0 * 1000.0;

bool Runs(v1::JobState s) { return s == v1::RUNNING || s == v1::CANCELLING; }

// Milliseconds the job's ranks ran: from its state history, else its latest launch.
int64_t RunMs(const v1::Job& job, int64_t now_ms) {
  if (job.history_size() == 0) {
    if (job.started_unix_ms() <= 0) return 0;
    const int64_t end = job.finished_unix_ms() > 0 ? job.finished_unix_ms() : now_ms;
    return std::max<int64_t>(0, end - job.started_unix_ms());
  }
  int64_t total = 0, since = -1;
  for (const v1::StateChange& c : job.history()) {
    if (since >= 0) total += std::max<int64_t>(0, c.time_unix_ms() - since);
    since = Runs(c.state()) ? c.time_unix_ms() : -1;
  }
  if (since >= 0) total += std::max<int64_t>(0, now_ms - since);
  return total;
}

std::string Fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

double Field(const nlohmann::json& r, const char* key) {
  return r.contains(key) && r[key].is_number() ? r[key].get<double>() : -1.0;
}

}  // namespace

JobUsage ComputeJobUsage(const v1::Job& job, int64_t now_unix_ms, double price_per_hour, uint32_t host_gpus) {
  JobUsage u;
  u.run_hours = static_cast<double>(RunMs(job, now_unix_ms)) / kMsPerHour;
  u.gpu_hours = u.run_hours * job.gpus();
  u.price_per_hour = price_per_hour > 0 ? price_per_hour : 0;
  if (u.price_per_hour > 0) {
    const double share =
        job.gpus() > 0 && host_gpus >= job.gpus() ? static_cast<double>(job.gpus()) / host_gpus : 1.0;
    u.cost = u.run_hours * u.price_per_hour * share;
  }
  return u;
}

nlohmann::json UsageToJson(const JobUsage& u) {
  return {{"run_hours", u.run_hours},
          {"gpu_hours", u.gpu_hours},
          {"price_per_hour", u.price_per_hour},
          {"cost", u.cost ? nlohmann::json(*u.cost) : nlohmann::json(nullptr)}};
}

std::string UsageText(const JobUsage& u) {
  std::string s = u.gpu_hours > 0 || u.run_hours == 0 ? Fmt("%.2f GPU-hours", u.gpu_hours)
                                                      : Fmt("%.2f h on CPU", u.run_hours);
  if (u.cost) return s + Fmt(", $%.2f", *u.cost) + Fmt(" at $%.2f/h", u.price_per_hour);
  return s + " (no --price-per-hour: no cost)";
}

int64_t WallClockUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::optional<JobUsage> FetchJobUsage(Reconnector* rc, const std::string& job_id) {
  v1::Job job;
  v1::HealthResponse health;
  if (!GetJob(rc, job_id, &job).ok() || !GetHealth(rc, &health).ok()) return std::nullopt;
  return ComputeJobUsage(job, WallClockUnixMs(), health.auto_stop().price_per_hour(), health.gpus_total());
}

StatusOr<std::optional<StepRecord>> ParseStepRecord(std::string_view text) {
  const std::string where = "metric record";
  SFT_ASSIGN_OR_RETURN(EventLine ev, ParseEventLine(text, where));
  if (ev.type != EventKind::kStep) return std::optional<StepRecord>();
  if (!ev.step) return FieldError(where, "step", "missing (expected an integer)");
  return std::optional<StepRecord>(StepRecord{*ev.step, std::move(ev.json)});
}

StatusOr<std::optional<StepRecord>> LatestStepRecord(Reconnector* rc, const std::string& job_id,
                                                     uint64_t last_seq, uint64_t window) {
  std::optional<StepRecord> latest;
  auto r = FollowEvents(rc, job_id, last_seq > window ? last_seq - window : 0, /*follow=*/false,
                        [&](const v1::Event& e) {
                          if (e.kind() != v1::Event::METRIC || e.rank() != 0) return;
                          auto rec = ParseStepRecord(e.text());
                          if (rec.ok() && rec->has_value()) latest = std::move(**rec);
                        });
  if (!r.ok()) return r.status();
  return latest;
}

std::string ResourceSummary(const nlohmann::json& r) {
  std::vector<std::string> parts;
  if (const double v = Field(r, "rss_mb"); v >= 0) parts.push_back(Fmt("rss %.2fG", v / 1024));
  if (const double v = Field(r, "gpu_mem_allocated_mb"); v >= 0) {
    std::string detail;
    if (const double p = Field(r, "gpu_mem_peak_mb"); p >= 0) detail += Fmt("peak %.2fG", p / 1024);
    if (const double q = Field(r, "gpu_mem_reserved_mb"); q >= 0)
      detail += (detail.empty() ? "" : ", ") + Fmt("reserved %.2fG", q / 1024);
    parts.push_back(Fmt("gpu mem %.2fG", v / 1024) + (detail.empty() ? "" : " (" + detail + ")"));
  }
  if (const double v = Field(r, "gpu_util_pct"); v >= 0) parts.push_back(Fmt("util %.0f%%", v));
  if (const double v = Field(r, "gpu_power_w"); v >= 0) parts.push_back(Fmt("%.0f W", v));
  if (const double v = Field(r, "mfu"); v >= 0) parts.push_back(Fmt("mfu %.1f%%", v * 100));
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? " " : ", ") + p;
  return out;
}

}  // namespace sftctl::client
