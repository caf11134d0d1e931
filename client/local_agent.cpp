#include "client/local_agent.h"

namespace sftctl::client {

// Placeholder until the remote-commands work lands.
StatusOr<std::unique_ptr<AgentConnection>> ConnectLocalAgent(const ConnectOptions& opts) {
  return UnimplementedError("local agent connection is not implemented yet");
}

}  // namespace sftctl::client
