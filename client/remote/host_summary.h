// HostSummary: what `sftctl status` and `sftctl list` show of a host besides its jobs: the agent's
// uptime, a cost estimate and the stop policy with its countdown (HealthResponse.auto_stop; see
// docs/agent.md, "Stopping the host").
//
// Thread safety: stateless functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "client/remote/agent_session.h"
#include "common/status.h"
#include "sftctl/v1/agent.pb.h"

namespace sftctl::client {

// Health through WithRetry. Errors name the host.
Status GetHealth(Reconnector* rc, v1::HealthResponse* health);

// {"uptime_s", "cost_estimate", "price_per_hour", "auto_stop": {"policy", "state", "remaining_s",
// "detail", "action", "stop_when_idle_s", "last_action"}, "cost_cap": {"max_cost", "spent",
// "billing_since_unix_s", "remaining_s", "reached", "reason"}}.
nlohmann::json HostSummaryJson(const v1::HealthResponse& health);

// Two to five lines, each ending in "\n", every line indented by `indent`:
//   HOST: sftd up 3h12m, ~$4.16 so far at $1.30/h
//   auto-stop: stop when idle 2h00m, ...; action runpod
//   auto-stop now: countdown, stops in 1h40m (quiet for 20m00s of 2h00m)
//   cost cap $25.00: $3.10 spent, stops in 8h46m
// and once the cap is reached (with the agent's reason):
//   cost cap $25.00 reached: $24.61 spent at $2.49/h since 2026-11-28T10:00:00Z; jobs cancelled; the
//   cap stopped the host
// Text from the agent is escaped for the terminal.
std::string HostSummaryText(const std::string& host, const v1::HealthResponse& health,
                            const std::string& indent);

// "45s", "12m05s", "2h00m", "3d04h".
std::string FormatSeconds(int64_t seconds);

}  // namespace sftctl::client
