// Reaching sftd on a remote host through one SSH session (libssh2): "the remote agent", not the SSH
// key agent (ssh-agent, which client/remote/ssh/ssh_session.cpp uses for authentication).
#pragma once

#include <memory>

#include "client/remote/agent_connection.h"
#include "client/remote/ssh/ssh_session.h"

namespace sftctl::client {

// Connects over SSH (host key verified against known_hosts, key/agent authentication), finds or
// starts sftd on the host, reads its token through the session, and opens the gRPC channel through
// a direct-tcpip channel or, when forwarding is refused, an exec channel running `sftd bridge`.
// With opts.known_agents, what an earlier connection with those options learned of the agent is
// tried first (asked on the host again when it fails), and what this one learns is kept there.
StatusOr<std::unique_ptr<AgentConnection>> ConnectOverSsh(const ConnectOptions& opts);

// An empty KnownAgents for ConnectOptions::known_agents (thread-safe; shared by the options' copies).
std::shared_ptr<KnownAgents> NewKnownAgents();

// Only the SSH session to opts.host, connected the way ConnectOverSsh connects (~/.ssh/config,
// ProxyJump/ProxyCommand, host key policy, keys), in blocking setup mode: for commands that run
// programs on the host themselves (`sftctl bootstrap`). The caller owns the session.
StatusOr<std::unique_ptr<ssh::SshSession>> OpenSshSession(const ConnectOptions& opts);

// `s` as one word for a POSIX shell: single-quoted, each ' as '\''.
std::string ShellQuote(const std::string& s);

}  // namespace sftctl::client
