// The agent of this machine, reached without SSH: runs the sibling `sftd` binary (status, start
// --detach), reads the token file and connects to 127.0.0.1:<port>.
#pragma once

#include <memory>

#include "client/remote/agent_connection.h"

namespace sftctl::client {

// REQUIRES: IsLocalAgentHost(opts.host).
StatusOr<std::unique_ptr<AgentConnection>> ConnectLocalAgent(const ConnectOptions& opts);

}  // namespace sftctl::client
