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
            {"last_action", as.last_action()}}}};
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
  return out;
}

}  // namespace sftctl::client
