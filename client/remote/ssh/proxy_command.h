// ProxyCommand transport: runs `/bin/sh -c "exec COMMAND"` (ssh_config's ProxyCommand, its tokens
// already expanded and made shell-safe by ExpandProxyCommand, ssh_config.h) with one end of a socketpair as
// its stdin and stdout; the SSH session talks through the other end. The command's stderr goes through to
// sftctl's stderr as it arrives (a proxy may print a login link) and its last 4 KiB are kept for error
// messages.
//
// Ownership: the transport owns the child. Destroying it closes the socket (the proxy sees EOF),
// sends SIGTERM, then SIGKILL after 1 s, and reaps the child; it returns within about 1.2 s.
// Thread safety: one thread at a time (the session's owner); an internal thread reads stderr.
#pragma once

#include <memory>
#include <string>

#include "client/remote/ssh/ssh_transport.h"
#include "common/status.h"

namespace sftctl::client::ssh {

// Starts the command. INTERNAL when the socketpair, the pipe or fork fails; a command that cannot
// run shows up later: the session's handshake fails and Problem() says "ProxyCommand `...` ended
// (exit code 127); its stderr: sh: 1: ...: not found".
StatusOr<std::unique_ptr<SshTransport>> StartProxyCommand(const std::string& command);

}  // namespace sftctl::client::ssh
