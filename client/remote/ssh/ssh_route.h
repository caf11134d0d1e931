// ConnectRoute: one authenticated SshSession to a resolved host, reached the way its ssh config says:
//   * directly over TCP;
//   * through its ProxyCommand (proxy_command.h);
//   * through its ProxyJump chain "j1,j2,...": a session to j1 (resolved through the config, with j1's
//     own ProxyJump/ProxyCommand honoured), a direct-tcpip channel from it to j2 (whose own proxy
//     options are ignored, as with OpenSSH's -J), ..., and finally a direct-tcpip channel from the last
//     jump host to the target. Each channel is relayed by a ChannelPump thread into a socketpair whose
//     other end the next session runs over.
// Every hop is a full SshSession: its host key is checked under its own name (the target's under the
// target's HostName and port, never the jump host's), and it authenticates with the same options
// (-i is tried on every hop, then ssh-agent, the hop's IdentityFiles, the default keys). Hops deeper
// than 8 are refused (a ProxyJump loop); a host that names itself as its first jump host (`Host *`
// with ProxyJump) is reached directly.
//
// Ownership: the returned session owns its transport, which owns the previous hop's session, and so
// on: destroying the session tears the chain down from the target to the first hop. Reconnecting
// (client/remote/agent_session.h) calls ConnectRoute again and so rebuilds the whole chain.
// Thread safety: none; call from one thread.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "client/remote/ssh/ssh_config.h"
#include "client/remote/ssh/ssh_session.h"
#include "common/status.h"

namespace sftctl::client::ssh {

struct RouteOptions {
  SessionOptions session;   // for every hop; `session.host` is replaced by each hop's ResolvedHost
  std::string config_file;  // resolves jump hosts; "" or a missing file: no config
  std::string home, local_user;
  std::function<void(const std::string&)> warn;  // the config's warnings (target and hops); may be empty
};

// Errors are those of SshSession::ConnectOver for the hop that failed (prefixed with that hop's
// "user@host:port"), config errors of jump hosts ("file:line: ..."), and UNAVAILABLE "... cannot reach
// H:P through jump host J: ..." when a jump host cannot open the channel onward.
StatusOr<std::unique_ptr<SshSession>> ConnectRoute(const ResolvedHost& target, const RouteOptions& opts);

}  // namespace sftctl::client::ssh
