// SshTransport: how an SshSession gets its connected byte stream. The session hands libssh2 the
// transport's descriptor and never connects anything itself, so the same session code runs over
//   * a direct TCP connection (ConnectTcp, here),
//   * a ProxyCommand child process (proxy_command.h), and
//   * a direct-tcpip channel of a session to a jump host (ssh_route.h, ProxyJump).
//
// Ownership: the transport owns its descriptor and whatever keeps it up (a child process, a relay
// thread with the jump host's session); destroying it closes the descriptor and stops those. An
// SshSession owns its transport and destroys it after freeing its libssh2 session.
// Thread safety: fd() and Hops() are constant; Problem() may be called from any one thread at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl::client::ssh {

class SshTransport {
 public:
  virtual ~SshTransport() = default;
  // The connected stream (a TCP socket or one end of a socketpair). Owned by the transport.
  virtual int fd() const = 0;
  // What the transport knows about a failure, for error messages (a ProxyCommand's exit status and
  // stderr, why a jump host's channel ended); "" when it knows nothing. May wait up to about 1 s for a
  // failing ProxyCommand to exit.
  virtual std::string Problem() { return ""; }
  // The way in, first hop first, e.g. {"jump host me@bastion:22"} or {"ProxyCommand `...`"}; empty
  // for a direct connection.
  virtual std::vector<std::string> Hops() const { return {}; }
};

// A TCP connection to host:port (every address getaddrinfo gives, in order) within timeout_ms, with
// TCP_NODELAY and SO_KEEPALIVE. Errors are prefixed with `display`: UNAVAILABLE (cannot resolve or
// connect), DEADLINE_EXCEEDED (timeout).
StatusOr<std::unique_ptr<SshTransport>> ConnectTcp(const std::string& host, int port, int timeout_ms,
                                                   const std::string& display);

// A transport over an already connected descriptor, which it takes over (closes on destruction);
// `hops` is what Hops() reports. Used by the jump-host route and by tests.
std::unique_ptr<SshTransport> AdoptFd(int fd, std::vector<std::string> hops = {});

}  // namespace sftctl::client::ssh
