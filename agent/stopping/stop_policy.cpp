#include "agent/stopping/stop_policy.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace sftctl::agent {
namespace {

bool EnvSet(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

bool Under(const std::string& path, const std::string& folder) {
  return path == folder || path.rfind(folder + "/", 0) == 0;
}

int64_t Seconds(Clock::TimePoint::duration d) {
  return std::chrono::duration_cast<std::chrono::seconds>(d).count();
}

// Seconds left until `total` has passed since `since` (rounded up, so 0 means "now").
int64_t Left(Clock::TimePoint now, Clock::TimePoint since, int64_t total) {
  const auto left = since + std::chrono::seconds(total) - now;
  if (left <= Clock::TimePoint::duration::zero()) return 0;
  return (std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 999) / 1000;
}

std::string Dollars(double v) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "$%.2f", v);
  return buf;
}

}  // namespace

StopPolicy ApplyStopFlags(StopPolicy p, const StopPolicyFlags& f) {
  if (f.idle_s) p.idle_s = *f.idle_s;
  if (f.grace_s) p.grace_s = *f.grace_s;
  if (f.pull_timeout_s) p.pull_timeout_s = *f.pull_timeout_s;
  if (f.command) p.command = *f.command;
  if (f.action) {
    p.action = *f.action;
  } else if (f.command) {
    p.action = f.command->empty() ? "" : "command";
  }
  if (f.storage) p.storage = *f.storage;
  if (f.price_per_hour) p.price_per_hour = *f.price_per_hour;
  if (f.max_cost) p.max_cost = *f.max_cost;
  if (f.billing_since_unix_s) p.billing_since_unix_s = *f.billing_since_unix_s;
  return p;
}

StopEnv StopEnv::FromProcess() {
  StopEnv env;
  // RunPod keeps its variables in /etc/rp_environment, loaded only by login shells.
  env.runpod = EnvSet("RUNPOD_POD_ID") || ::access("/etc/rp_environment", R_OK) == 0;
  env.lambda = EnvSet("LAMBDA_API_KEY") && EnvSet("LAMBDA_INSTANCE_ID");
  auto value = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v == nullptr ? "" : v);
  };
  env.lambda_api = {value("LAMBDA_API_KEY"), value("LAMBDA_INSTANCE_ID"), value("LAMBDA_API_URL")};
  return env;
}

std::string ResolveAction(const StopPolicy& policy, const StopEnv& env) {
  if (!policy.action.empty()) return policy.action;
  if (!policy.command.empty()) return "command";
  if (env.runpod) return "runpod";
  if (env.lambda) return "lambda";
  return "";
}

StatusOr<std::string> ActionCommand(const std::string& action, const StopPolicy& policy) {
  if (action == "runpod") {
    return std::string(
        "[ -r /etc/rp_environment ] && . /etc/rp_environment; runpodctl stop pod \"$RUNPOD_POD_ID\"");
  }
  if (action == "runpod-terminate") {
    return std::string(
        "[ -r /etc/rp_environment ] && . /etc/rp_environment; runpodctl remove pod \"$RUNPOD_POD_ID\"");
  }
  if (action == "lambda") {  // never a command: its key would be on curl's command line
    return InternalError(
        "the lambda stop action is an HTTPS request made by the agent (agent/stopping/stop_action.h)");
  }
  if (action == "shutdown") {
    return std::string("if [ \"$(id -u)\" = 0 ]; then shutdown -h now; else sudo -n shutdown -h now; fi");
  }
  if (action == "command" && !policy.command.empty()) return policy.command;
  return FailedPreconditionError(
      "no stop action: start the agent with --stop-action runpod|runpod-terminate|lambda|shutdown or "
      "--stop-command CMD "
      "(none was detected: no RUNPOD_POD_ID, no LAMBDA_API_KEY with LAMBDA_INSTANCE_ID)");
}

Status ValidateStopPolicy(const StopPolicy& p) {
  static const char* kActions[] = {"", "runpod", "runpod-terminate", "lambda", "shutdown", "command"};
  if (std::find(std::begin(kActions), std::end(kActions), p.action) == std::end(kActions)) {
    return InvalidArgumentError("--stop-action: '" + p.action +
                                "' is not one of runpod, runpod-terminate, lambda, shutdown, command");
  }
  if (p.action == "command" && p.command.empty()) {
    return InvalidArgumentError("--stop-command: required with --stop-action command");
  }
  if (p.storage != "auto" && p.storage != "survives" && p.storage != "lost") {
    return InvalidArgumentError("--stop-storage: '" + p.storage + "' is not one of auto, survives, lost");
  }
  if (p.idle_s < 0) return InvalidArgumentError("--stop-when-idle: must not be negative");
  if (p.grace_s < 0) return InvalidArgumentError("--stop-grace: must not be negative");
  if (p.pull_timeout_s < 0) return InvalidArgumentError("--stop-pull-timeout: must not be negative");
  if (p.price_per_hour < 0) return InvalidArgumentError("--price-per-hour: must not be negative");
  if (p.max_cost < 0) return InvalidArgumentError("--max-cost: must not be negative");
  if (p.max_cost > 0 && p.price_per_hour <= 0) {
    return InvalidArgumentError(
        "--max-cost: needs the host's price: give --price-per-hour too (the cap counts price x hours since "
        "billing began)");
  }
  if (p.billing_since_unix_s < 0) return InvalidArgumentError("--billing-since: must not be negative");
  return OkStatus();
}

bool StorageSurvives(const StopPolicy& policy, const std::string& data_dir, const StopEnv& env) {
  if (policy.storage == "survives") return true;
  if (policy.storage == "lost") return false;
  return (env.runpod && Under(data_dir, "/workspace")) || Under(data_dir, "/lambda/nfs");
}

nlohmann::json StopPolicyToJson(const StopPolicy& p) {
  return {{"idle_s", p.idle_s},
          {"grace_s", p.grace_s},
          {"pull_timeout_s", p.pull_timeout_s},
          {"action", p.action},
          {"command", p.command},
          {"storage", p.storage},
          {"price_per_hour", p.price_per_hour},
          {"max_cost", p.max_cost},
          {"billing_since_unix_s", p.billing_since_unix_s}};
}

StopPolicy StopPolicyFromJson(const nlohmann::json& j) {
  StopPolicy p;
  if (!j.is_object()) return p;
  p.idle_s = j.value("idle_s", p.idle_s);
  p.grace_s = j.value("grace_s", p.grace_s);
  p.pull_timeout_s = j.value("pull_timeout_s", p.pull_timeout_s);
  p.action = j.value("action", p.action);
  p.command = j.value("command", p.command);
  p.storage = j.value("storage", p.storage);
  p.price_per_hour = j.value("price_per_hour", p.price_per_hour);
  p.max_cost = j.value("max_cost", p.max_cost);
  p.billing_since_unix_s = j.value("billing_since_unix_s", p.billing_since_unix_s);
  return p;
}

std::string FormatDuration(int64_t s) {
  char buf[48];
  if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else if (s < 86400) {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lldd%02lldh", static_cast<long long>(s / 86400),
                  static_cast<long long>(s % 86400 / 3600));
  }
  return buf;
}

std::string DescribeStopPolicy(const StopPolicy& p, const std::string& resolved_action) {
  if (p.idle_s == 0 && resolved_action.empty() && p.max_cost <= 0) return "";
  std::string out = p.idle_s > 0 ? "stop when idle " + FormatDuration(p.idle_s) + ", or " : "stop ";
  out += FormatDuration(p.grace_s) + " after a stop-when-done job; action ";
  out += resolved_action.empty() ? "none" : resolved_action;
  if (p.price_per_hour > 0) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "; $%.2f/h", p.price_per_hour);
    out += buf;
  }
  if (p.max_cost > 0) out += "; cost cap " + Dollars(p.max_cost);
  return out;
}

std::string FormatUtc(int64_t unix_s) {
  const std::time_t t = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

CostCap DecideCostCap(const StopPolicy& p, int64_t now_unix_ms, int64_t lead_s) {
  CostCap c;
  if (p.price_per_hour <= 0 || p.billing_since_unix_s <= 0) return c;
  const int64_t elapsed_ms = std::max<int64_t>(0, now_unix_ms - p.billing_since_unix_s * 1000);
  c.spent = p.price_per_hour * static_cast<double>(elapsed_ms) / 3.6e6;
  if (p.max_cost <= 0) return c;
  c.on = true;
  // One product of whole milliseconds, so that "exactly at the cap" is exact.
  const int64_t horizon_ms = elapsed_ms + std::max<int64_t>(0, lead_s) * 1000;
  const double at_horizon = p.price_per_hour * static_cast<double>(horizon_ms) / 3.6e6;
  if (at_horizon >= p.max_cost) {
    c.reached = true;
    c.why = "cost cap " + Dollars(p.max_cost) + " reached: " + Dollars(c.spent) + " spent at " +
            Dollars(p.price_per_hour) + "/h since " + FormatUtc(p.billing_since_unix_s);
    return c;
  }
  const double cap_ms = p.max_cost / p.price_per_hour * 3.6e6;  // when the horizon reaches the cap
  c.remaining_s = static_cast<int64_t>(std::floor((cap_ms - static_cast<double>(horizon_ms)) / 1000.0));
  return c;
}

StopDecision DecideStop(const StopPolicy& p, const StopInputs& in) {
  StopDecision d;
  d.cap = DecideCostCap(p, in.now_unix_ms, in.cost_lead_s);
  if (d.cap.reached) {
    d.verdict = StopVerdict::kCostCap;
    d.why = d.cap.why;
    return d;
  }
  if (p.idle_s == 0 && !in.work_done && in.waiting_jobs == 0) {
    d.why = "no stop policy and no stop-when-done job";
    return d;
  }
  d.verdict = StopVerdict::kBusy;
  if (in.active_jobs > 0) {
    d.why = std::to_string(in.active_jobs) + " job(s) running or queued";
    return d;
  }
  if (in.open_calls > 0) {
    d.why = std::to_string(in.open_calls) + " client call(s) open";
    return d;
  }
  if (p.idle_s == 0 && !in.work_done) {
    d.why = "waiting for a stop-when-done job";
    return d;
  }
  const int64_t grace = in.work_done ? (p.idle_s > 0 ? std::min(p.idle_s, p.grace_s) : p.grace_s) : p.idle_s;
  const int64_t quiet = Seconds(in.now - in.quiet_since);
  if (int64_t left = Left(in.now, in.quiet_since, grace); left > 0) {
    d.verdict = StopVerdict::kCountdown;
    d.remaining_s = left;
    d.why = "quiet for " + FormatDuration(std::max<int64_t>(0, quiet)) + " of " + FormatDuration(grace);
    return d;
  }
  if (!in.unpulled.empty()) {
    if (int64_t left = Left(in.now, in.pull_wait_since, p.pull_timeout_s); left > 0) {
      d.verdict = StopVerdict::kAwaitPull;
      d.remaining_s = left;
      d.why = in.unpulled.front() + ": final checkpoint not pulled yet (`sftctl pull`)";
      return d;
    }
  }
  d.verdict = StopVerdict::kStopNow;
  d.why = in.work_done ? "a stop-when-done job ended and the host was quiet for " + FormatDuration(grace)
                       : "idle for " + FormatDuration(grace);
  if (!in.unpulled.empty()) d.why += " (gave up waiting for the pull of " + in.unpulled.front() + ")";
  return d;
}

const char* StopVerdictName(StopVerdict v) {
  switch (v) {
    case StopVerdict::kOff:
      return "off";
    case StopVerdict::kBusy:
      return "busy";
    case StopVerdict::kCountdown:
      return "countdown";
    case StopVerdict::kAwaitPull:
      return "await_pull";
    case StopVerdict::kStopNow:
      return "stopping";
    case StopVerdict::kCostCap:
      return "cost_cap";
  }
  return "off";
}

}  // namespace sftctl::agent
