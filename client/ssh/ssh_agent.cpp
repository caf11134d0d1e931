#include "client/ssh/ssh_agent.h"

namespace sftctl::client {

// Placeholder until the SSH transport lands.
StatusOr<std::unique_ptr<AgentConnection>> ConnectOverSsh(const ConnectOptions& opts) {
  return UnimplementedError("SSH transport is not implemented yet");
}

}  // namespace sftctl::client
