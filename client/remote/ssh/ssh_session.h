// SshSession: one libssh2 session to a host over an SshTransport (ssh_transport.h: TCP with a timeout,
// a ProxyCommand, a jump host's channel) — handshake with fast cipher/MAC preferences, strict
// known_hosts policy under the host's own name, public-key authentication (-i, ssh-agent, ssh config
// IdentityFile, ~/.ssh/id_ed25519, ~/.ssh/id_ecdsa), keepalives, and the channels the agent connection
// needs (exec, direct-tcpip).
//
// Thread safety: none. libssh2 sessions are not thread-safe: during setup the creating thread uses the
// session in blocking mode (every call bounded by the connect timeout); afterwards exactly one thread
// (the ChannelPump) may touch it, in non-blocking mode.
#pragma once

#include <libssh2.h>

#include <memory>
#include <string>
#include <vector>

#include "client/remote/ssh/ssh_config.h"
#include "client/remote/ssh/ssh_transport.h"
#include "common/status.h"

namespace sftctl::client::ssh {

struct SessionOptions {
  ResolvedHost host;
  std::string identity_file;     // -i: tried first
  std::string agent_socket;      // SSH_AUTH_SOCK; empty: no ssh-agent
  std::string home;              // for ~/.ssh defaults
  std::string known_hosts_file;  // REQUIRES: non-empty
  bool accept_new_host_key = false;
  int keepalive_s = 15;  // 0: off
  int connect_timeout_s = 20;
  // Cipher and MAC preferences (comma lists, most preferred first). Empty: the built-in fast order;
  // $SFTCTL_SSH_CIPHERS / $SFTCTL_SSH_MACS override it (benchmarks).
  std::string ciphers, macs;
};

struct ExecResult {
  int exit_code = -1;  // -1: the server sent no exit status (e.g. killed by a signal)
  std::string out, err;
};

class SshSession {
 public:
  // Connects, verifies the host key and authenticates. Errors (all prefixed "user@host:port: "):
  // UNAVAILABLE (cannot resolve/connect, handshake failed), DEADLINE_EXCEEDED (connect timeout),
  // UNAUTHENTICATED (unknown host key without accept_new_host_key, changed host key — never
  // authenticated to —, or every key refused, naming the keys tried; RSA keys get the libssh2
  // 1.10/OpenSSH 8.8 explanation).
  // Connect() makes a direct TCP connection to opts.host.hostname:port (no ProxyCommand/ProxyJump:
  // see ssh_route.h for those); ConnectOver() runs over `transport`, which it owns from then on. The
  // host key is checked under opts.host.hostname:port whatever the transport. A failure the transport
  // can explain (a ProxyCommand that exited, a jump host that went away) is appended in parentheses.
  static StatusOr<std::unique_ptr<SshSession>> Connect(const SessionOptions& opts);
  static StatusOr<std::unique_ptr<SshSession>> ConnectOver(std::unique_ptr<SshTransport> transport,
                                                           const SessionOptions& opts);
  ~SshSession();
  SshSession(const SshSession&) = delete;
  SshSession& operator=(const SshSession&) = delete;

  // Runs `command` through the remote user's shell and collects its output (setup phase, blocking).
  // UNAVAILABLE when the session fails, DEADLINE_EXCEEDED after timeout_s, RESOURCE_EXHAUSTED when
  // stdout or stderr exceeds kMaxExecOutputBytes; the command's own failure is in exit_code.
  static constexpr size_t kMaxExecOutputBytes = size_t{4} << 20;
  StatusOr<ExecResult> Exec(const std::string& command, int timeout_s) {
    return Exec(command, "", timeout_s);
  }
  // The same, with `input` written to the command's stdin (then EOF) before its output is read: for
  // small uploads (`cat > file`). The command must read all of its input before printing much.
  StatusOr<ExecResult> Exec(const std::string& command, const std::string& input, int timeout_s);

  // A direct-tcpip channel to host:port on the server side with a large receive window.
  // FAILED_PRECONDITION "... refused port forwarding (...)" when the server says no.
  StatusOr<LIBSSH2_CHANNEL*> OpenDirectTcpip(const std::string& host, int port);
  // An exec channel running `command` with a large receive window; stderr stays a separate stream.
  StatusOr<LIBSSH2_CHANNEL*> OpenExecChannel(const std::string& command);

  // Switches to non-blocking mode for the pump and arms keepalives (the pump sends them). After this
  // only one thread may use the session.
  void SetNonBlocking();
  // The pump has disconnected (or given up on) the session: the destructor only frees it.
  void MarkDisconnected() { disconnected_ = true; }

  LIBSSH2_SESSION* raw() const { return session_; }
  int socket_fd() const { return fd_; }
  const std::string& display() const { return display_; }  // "user@host:port"
  // The way in ("jump host ...", "ProxyCommand `...`"), first hop first; empty for direct TCP.
  std::vector<std::string> hops() const { return transport_->Hops(); }
  int keepalive_s() const { return keepalive_s_; }
  std::string negotiated() const;  // e.g. "aes128-ctr/hmac-sha2-256"
  std::string LastError() const;   // libssh2's last error message

  // The receive window and packet size asked for on the channels this session opens.
  static constexpr unsigned kWindow = 32u << 20;
  static constexpr unsigned kPacket = 32768;  // libssh2 1.10 rejects larger incoming packets

 private:
  SshSession() = default;
  // `s` with what the transport knows about the failure appended (when it knows something).
  Status WithTransportProblem(const Status& s);
  Status Handshake(const SessionOptions& opts);
  Status VerifyHostKey(const SessionOptions& opts);
  Status Authenticate(const SessionOptions& opts);
  StatusOr<LIBSSH2_CHANNEL*> OpenChannel(const char* type, const std::string& message);

  LIBSSH2_SESSION* session_ = nullptr;
  std::unique_ptr<SshTransport> transport_;  // freed after session_
  int fd_ = -1;                              // transport_->fd()
  std::string display_;
  int keepalive_s_ = 0;
  int timeout_ms_ = 20000;
  bool disconnected_ = false;
};

// The default cipher and MAC preference lists (fastest first with OpenSSL and AES-NI; see
// docs/ssh.md for the measurements).
const char* DefaultCiphers();
const char* DefaultMacs();

}  // namespace sftctl::client::ssh
