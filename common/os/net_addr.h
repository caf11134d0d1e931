// Address helpers shared by the agent (which addresses it may listen on without TLS, what node 0 of
// a multi-node job reports) and the trainer (where Gloo binds).
//
// Thread safety: pure functions.
#pragma once

#include <string_view>

namespace sftctl {

// True for "localhost", "::1" (bracketed or not) and IPv4 literals in 127.0.0.0/8. Does not resolve
// names: any other host name is not loopback.
bool IsLoopbackHost(std::string_view host);

}  // namespace sftctl
