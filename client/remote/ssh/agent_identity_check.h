// CheckAgentIdentity: the client's side of proto Identify. Every connection to an agent, over SSH or
// to this machine's agent, calls it before any call carries the token (docs/ssh.md, "Trust").
//
// Thread safety: reentrant; the connection is used for one unary call.
#pragma once

#include <string>

#include "client/remote/agent_connection.h"
#include "common/status.h"

namespace sftctl::client {

// Asks the server behind `conn` to prove that it knows `token` and listens on `expected_addr`
// ("127.0.0.1:41234" or "[::1]:41234", as `sftd status` reports it), with a fresh random challenge
// and no authorization metadata. A server that cannot — one that took an address the agent left, or
// one that relays to the agent on its new address — is refused (PERMISSION_DENIED, or UNAVAILABLE when
// it does not answer) with "the agent token was not sent" in the message. With `allow_legacy`, an
// agent that predates Identify (UNIMPLEMENTED) is accepted with a warning on stderr, once per process.
// `context` starts every message (the host as the user named it).
Status CheckAgentIdentity(const AgentConnection& conn, const std::string& expected_addr, bool allow_legacy,
                          int timeout_s, const std::string& context);

}  // namespace sftctl::client
