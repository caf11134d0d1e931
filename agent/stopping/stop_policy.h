// StopPolicy: when the agent stops (and so stops paying for) its host, and how. The one decision
// "may the host stop now?" is DecideStop, a pure function of the policy and a snapshot of the agent
// (agent/stopping/auto_stop.h gathers it on its own thread and runs the action). docs/agent.md, "Stopping the
// host".
//
// Thread safety: plain values and pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/os/clock.h"
#include "common/status.h"

namespace sftctl::agent {

struct StopPolicy {
  int64_t idle_s = 0;             // --stop-when-idle: stop after this long with nothing to do; 0: off
  int64_t grace_s = 60;           // --stop-grace: quiet time after a stop-when-done job ended
  int64_t pull_timeout_s = 1800;  // --stop-pull-timeout: longest wait for the final checkpoint's pull
  // --stop-action: "runpod" (stop the pod), "runpod-terminate" (remove it: what `sftctl up` asks for),
  // "lambda", "shutdown", "command" (run `command`), or "" (detect: RunPod,
  // then Lambda, else none).
  std::string action;
  std::string command;           // --stop-command
  std::string storage = "auto";  // --stop-storage: "auto", "survives" or "lost" (the data dir's fate)
  double price_per_hour = 0;     // --price-per-hour; 0: unknown
  double max_cost = 0;           // --max-cost: USD the host may cost since billing began; 0: no cap
  // --billing-since: when the host's billing began (Unix seconds); 0: not known yet (LoadStopPolicy sets
  // it to the first start of an agent with a price on this data dir).
  int64_t billing_since_unix_s = 0;
};

// The `sftd start` flags of a policy: only those given change the persisted policy.
struct StopPolicyFlags {
  std::optional<int64_t> idle_s, grace_s, pull_timeout_s;
  std::optional<std::string> action, command, storage;
  std::optional<double> price_per_hour, max_cost;
  std::optional<int64_t> billing_since_unix_s;
  bool any() const {
    return idle_s || grace_s || pull_timeout_s || action || command || storage || price_per_hour ||
           max_cost || billing_since_unix_s;
  }
};
// `base` with the given flags applied (a --stop-command alone implies --stop-action command).
StopPolicy ApplyStopFlags(StopPolicy base, const StopPolicyFlags& flags);

// What the "lambda" stop action needs (agent/stopping/stop_action.h), from the agent's environment (which
// ~/.config/sftd/env fills; `sftctl up --terminate-from-host` writes it there): LAMBDA_API_KEY, a secret
// the agent never logs, stores, shows or puts on a command line; LAMBDA_INSTANCE_ID; LAMBDA_API_URL
// ("": kLambdaApiUrl, common/lambda_api.h).
struct LambdaApi {
  std::string api_key;
  std::string instance_id;
  std::string api_url;
};

// What the process environment says about the host (StopEnv::FromProcess reads it).
struct StopEnv {
  bool runpod = false;  // RUNPOD_POD_ID set, or /etc/rp_environment exists
  bool lambda = false;  // LAMBDA_API_KEY and LAMBDA_INSTANCE_ID set
  LambdaApi lambda_api;
  static StopEnv FromProcess();
};

// The action `policy` resolves to on `env`: policy.action, or for "" the detected one; "" when none.
std::string ResolveAction(const StopPolicy& policy, const StopEnv& env);
// The shell command of an action that is one: runpod, runpod-terminate, shutdown, command
// (docs/agent.md lists them). None names a secret: runpodctl reads its key from its environment.
// "lambda" is no shell command (agent/stopping/stop_action.h makes its request in this process, so the key is
// on no command line): INTERNAL. Errors: FAILED_PRECONDITION when there is no action ("" or "command" without
// a command).
StatusOr<std::string> ActionCommand(const std::string& action, const StopPolicy& policy);
// INVALID_ARGUMENT naming the flag: an unknown action or storage, "command" without a command,
// negative durations, price, cost cap or billing start; a cost cap without a price (naming --max-cost
// and --price-per-hour).
Status ValidateStopPolicy(const StopPolicy& policy);

// Whether the data dir outlives the stop: "survives"/"lost" as set; "auto": under /workspace on
// RunPod (kept across a pod stop), or under /lambda/nfs/ (Lambda's persistent file system).
bool StorageSurvives(const StopPolicy& policy, const std::string& data_dir, const StopEnv& env);

// Persistence (the agent's settings table) and display.
nlohmann::json StopPolicyToJson(const StopPolicy& policy);
StopPolicy StopPolicyFromJson(const nlohmann::json& j);
// "stop when idle 2h, 1m after a stop-when-done job; action runpod; $1.20/h; cost cap $25.00"; "" when
// neither idle, nor any action, nor a cost cap is set.
std::string DescribeStopPolicy(const StopPolicy& policy, const std::string& resolved_action);
// "45s", "12m05s", "2h00m", "3d04h".
std::string FormatDuration(int64_t seconds);

// The cost cap (--max-cost). The host's spend is price_per_hour x the hours since billing began; the
// cap is reached once the spend plus what the host costs over `lead_s` more (the time the agent needs
// to notice it and stop: see AutoStop's lead) would reach max_cost, so the host stops before it passes.
struct CostCap {
  bool on = false;          // a cap, a price and a billing start are known
  bool reached = false;     // on, and spent + price x lead >= max_cost
  double spent = 0;         // USD since billing began (also when no cap is set, with a price)
  int64_t remaining_s = 0;  // on and not reached: seconds until it is (rounded down)
  std::string why;          // reached: "cost cap $25.00 reached: $24.61 spent at $2.49/h since
                            // 2026-11-28T10:00:00Z"
};
// Pure: `now_unix_ms` is the wall time of the decision. Off when max_cost, price_per_hour or
// billing_since_unix_s is 0. A billing start in the future counts as nothing spent.
CostCap DecideCostCap(const StopPolicy& policy, int64_t now_unix_ms, int64_t lead_s);
// "2026-11-28T10:00:00Z".
std::string FormatUtc(int64_t unix_s);

// A snapshot of the agent for one decision.
struct StopInputs {
  Clock::TimePoint now;
  // The last moment the agent was not quiet: a client call began or ended, a job was active, the agent
  // started, or a stop action failed.
  Clock::TimePoint quiet_since;
  uint32_t active_jobs = 0;   // running, cancelling or queued
  uint32_t open_calls = 0;    // client RPCs in progress (logs -f, pulls, uploads)
  uint32_t waiting_jobs = 0;  // stop-when-done jobs that have not ended
  bool work_done = false;     // a stop-when-done job has ended (and no stop has followed it)
  // Ended stop-when-done jobs whose newest complete checkpoint was neither pulled nor on surviving
  // storage, and since when the agent waits for that.
  std::vector<std::string> unpulled;
  Clock::TimePoint pull_wait_since;
  int64_t now_unix_ms = 0;  // the wall time, for the cost cap
  int64_t cost_lead_s = 0;  // DecideCostCap's lead
};

// kCostCap: the cost cap is reached; every job is cancelled and the host stops, busy or not.
enum class StopVerdict { kOff, kBusy, kCountdown, kAwaitPull, kStopNow, kCostCap };

struct StopDecision {
  StopVerdict verdict = StopVerdict::kOff;
  int64_t remaining_s = 0;  // kCountdown, kAwaitPull
  std::string why;
  CostCap cap;  // DecideCostCap's answer, whatever the verdict
};

// The one place that decides. CostCap: DecideCostCap says the cap is reached (before anything else:
// jobs and clients do not hold a host past its cap). Off: no idle policy and no stop-when-done job. Busy: a
// job is active, a client call is open, or only stop-when-done jobs that have not ended arm the stop.
// Countdown: quiet for less than the grace (policy.idle_s; after a stop-when-done job, the shorter of it and
// grace_s). AwaitPull: `unpulled` is not empty and pull_timeout_s has not passed. Otherwise StopNow.
StopDecision DecideStop(const StopPolicy& policy, const StopInputs& in);
const char* StopVerdictName(StopVerdict v);

}  // namespace sftctl::agent
