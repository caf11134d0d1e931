#include "client/remote/agent_connection.h"

namespace sftctl::client {

bool IsLocalAgentHost(const std::string& host) {
  return host == "local" || host == "localhost" || host.rfind("local:", 0) == 0;
}

}  // namespace sftctl::client
