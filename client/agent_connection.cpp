#include "client/agent_connection.h"

#include "client/local_agent.h"
#include "client/ssh/remote_agent.h"

namespace sftctl::client {

bool IsLocalAgentHost(const std::string& host) {
  return host == "local" || host == "localhost" || host.rfind("local:", 0) == 0;
}

StatusOr<std::unique_ptr<AgentConnection>> ConnectToAgent(const ConnectOptions& opts) {
  if (IsLocalAgentHost(opts.host)) return ConnectLocalAgent(opts);
  return ConnectOverSsh(opts);
}

}  // namespace sftctl::client
