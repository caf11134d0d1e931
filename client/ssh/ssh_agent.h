// Reaching sftd on a remote host through one SSH session (libssh2).
#pragma once

#include <memory>

#include "client/agent_connection.h"

namespace sftctl::client {

// Connects over SSH (host key verified against known_hosts, key/agent authentication), finds or
// starts sftd on the host, reads its token through the session, and opens the gRPC channel through
// a direct-tcpip channel or, when forwarding is refused, an exec channel running `sftd bridge`.
StatusOr<std::unique_ptr<AgentConnection>> ConnectOverSsh(const ConnectOptions& opts);

}  // namespace sftctl::client
