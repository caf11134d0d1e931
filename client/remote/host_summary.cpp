#include "client/remote/host_summary.h"

#include <cstdio>

#include "common/terminal_text.h"

namespace sftctl::client {

Status GetHealth(Reconnector* rc, v1::HealthResponse* health) {
  return WithRetry(rc, [&](AgentSession& a) {
    grpc::ClientContext ctx;
    a.Prepare(&ctx);
    return FromGrpc(a.stub()->Health(&ctx, v1::HealthRequest(), health), a.host() + ": health");
  });
}

std::string FormatSeconds(int64_t s) {
  char buf[48];
  const long long v = static_cast<long long>(s < 0 ? 0 : s);
  if (v < 60) {
    std::snprintf(buf, sizeof(buf), "%llds", v);
  } else if (v < 3600) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", v / 60, v % 60);
  } else if (v < 86400) {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", v / 3600, v % 3600 / 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%lldd%02lldh", v / 86400, v % 86400 / 3600);
  }
  return buf;
}

namespace {

// "cost cap $25.00: $3.10 spent, stops in 8h46m", or once reached the agent's reason and what followed;
// "" without a cap.
std::string CostCapLine(const v1::AutoStopStatus& as, const std::string& indent) {
  if (as.max_cost() <= 0) return "";
  char buf[96];
  if (!as.cost_cap_reached()) {
    std::snprintf(buf, sizeof(buf), "cost cap $%.2f: $%.2f spent, stops in ", as.max_cost(), as.spent());
    return indent + buf + FormatSeconds(as.cost_cap_remaining_s()) + "\n";
  }
  std::string line = indent + EscapeForTerminal(as.cost_cap_reason()) + "; jobs cancelled";
  if (as.state() == "stopped") {
    line += "; the cap stopped the host";
  } else if (as.state() == "stopping") {
    line += "; the host is stopping";
  }
  return line + "\n";
}

}  // namespace

nlohmann::json HostSummaryJson(const v1::HealthResponse& h) {
  const v1::AutoStopStatus& as = h.auto_stop();
  return {{"uptime_s", h.uptime_s()},
          {"price_per_hour", as.price_per_hour()},
          {"cost_estimate", as.cost_estimate()},
          {"auto_stop",
           {{"policy", as.policy()},
            {"state", as.state().empty() ? "off" : as.state()},
            {"remaining_s", as.remaining_s()},
            {"detail", as.detail()},
            {"action", as.action()},
            {"stop_when_idle_s", as.stop_when_idle_s()},
            {"last_action", as.last_action()}}},
          {"cost_cap",
           {{"max_cost", as.max_cost()},
            {"spent", as.spent()},
            {"billing_since_unix_s", as.billing_since_unix_s()},
            {"remaining_s", as.cost_cap_remaining_s()},
            {"reached", as.cost_cap_reached()},
            {"reason", as.cost_cap_reason()}}}};
}

std::string HostSummaryText(const std::string& host, const v1::HealthResponse& h, const std::string& indent) {
  const v1::AutoStopStatus& as = h.auto_stop();
  std::string out = indent + host + ": sftd up " + FormatSeconds(h.uptime_s());
  if (as.price_per_hour() > 0) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), ", ~$%.2f so far at $%.2f/h", as.cost_estimate(), as.price_per_hour());
    out += buf;
  } else {
    out += " (no --price-per-hour: no cost estimate)";
  }
  out +=
      "\n" + indent + "auto-stop: " + (as.policy().empty() ? "off" : EscapeForTerminal(as.policy())) + "\n";
  const std::string& state = as.state();
  if (!as.policy().empty() && !state.empty()) {
    out += indent + "auto-stop now: " + EscapeForTerminal(state);
    if (state == "countdown") out += ", stops in " + FormatSeconds(as.remaining_s());
    if (state == "await_pull") out += ", stops at the latest in " + FormatSeconds(as.remaining_s());
    if (!as.detail().empty()) out += " (" + EscapeForTerminal(as.detail()) + ")";
    out += "\n";
  }
  if (!as.last_action().empty())
    out += indent + "last stop action: " + EscapeForTerminal(as.last_action()) + "\n";
  return out + CostCapLine(as, indent);
}

}  // namespace sftctl::client
