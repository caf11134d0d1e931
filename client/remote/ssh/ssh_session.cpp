#include "client/remote/ssh/ssh_session.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "client/remote/ssh/known_hosts.h"
#include "client/remote/ssh/ssh_keys.h"

namespace sftctl::client::ssh {
namespace {

// Measured on loopback with OpenSSL + AES-NI + SHA-NI (docs/ssh.md): AES-CTR costs far less than the
// MAC; hmac-sha2-256 and hmac-sha1 are close with SHA-NI. libssh2 1.10 has no AES-GCM, no
// chacha20-poly1305 and no -etm MACs. Names libssh2 does not know are dropped by method_pref.
constexpr char kCiphers[] = "aes128-ctr,aes256-ctr,aes192-ctr,aes128-cbc,aes256-cbc,aes192-cbc";
constexpr char kMacs[] = "hmac-sha2-256,hmac-sha1,hmac-sha2-512";
// OpenSSH's own order, so a known_hosts written by OpenSSH (usually the ed25519 key) matches.
constexpr char kHostKeys[] =
    "ssh-ed25519,ecdsa-sha2-nistp256,ecdsa-sha2-nistp384,ecdsa-sha2-nistp521,ssh-rsa";

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool FileExists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string RsaAdvice(const std::string& key) {
  return "the RSA key " + key +
         " cannot be used: libssh2 1.10 signs only with ssh-rsa (SHA-1), which OpenSSH >= 8.8 refuses by "
         "default (no rsa-sha2-256/512 before libssh2 1.11). Create an ed25519 key with `ssh-keygen -t "
         "ed25519`, "
         "add the .pub line to ~/.ssh/authorized_keys on the host, and pass it with -i (or add it to "
         "ssh-agent)";
}

}  // namespace

const char* DefaultCiphers() { return kCiphers; }
const char* DefaultMacs() { return kMacs; }

SshSession::~SshSession() {
  if (session_ != nullptr) {
    if (!disconnected_) {
      // Setup-phase failure: blocking mode, bounded by a short timeout.
      libssh2_session_set_timeout(session_, 2000);
      libssh2_session_disconnect(session_, "sftctl: bye");
    }
    libssh2_session_set_blocking(session_, 0);
    libssh2_session_free(session_);
  }
  transport_.reset();  // closes fd_
}

std::string SshSession::LastError() const {
  char* msg = nullptr;
  int len = 0;
  libssh2_session_last_error(session_, &msg, &len, 0);
  return msg != nullptr && len > 0 ? std::string(msg, static_cast<size_t>(len)) : "unknown libssh2 error";
}

std::string SshSession::negotiated() const {
  const char* c = libssh2_session_methods(session_, LIBSSH2_METHOD_CRYPT_SC);
  const char* m = libssh2_session_methods(session_, LIBSSH2_METHOD_MAC_SC);
  return std::string(c ? c : "?") + "/" + (m ? m : "?");
}

void SshSession::SetNonBlocking() {
  libssh2_session_set_blocking(session_, 0);
  // libssh2 keepalives are armed only now, for the pump. In blocking mode libssh2 caps each wait at the
  // keepalive interval and reports LIBSSH2_ERROR_TIMEOUT when nothing arrives in it, so a remote command
  // that is silent for longer than one interval (`sftd start` on a loaded host) would fail as timed out.
  if (keepalive_s_ > 0) libssh2_keepalive_config(session_, 1, static_cast<unsigned>(keepalive_s_));
}

StatusOr<std::unique_ptr<SshSession>> SshSession::Connect(const SessionOptions& opts) {
  SFT_ASSIGN_OR_RETURN(std::unique_ptr<SshTransport> tcp,
                       ConnectTcp(opts.host.hostname, opts.host.port,
                                  std::max(1, opts.connect_timeout_s) * 1000, opts.host.Display()));
  return ConnectOver(std::move(tcp), opts);
}

StatusOr<std::unique_ptr<SshSession>> SshSession::ConnectOver(std::unique_ptr<SshTransport> transport,
                                                              const SessionOptions& opts) {
  static std::once_flag once;
  static int init_rc = 0;
  std::call_once(once, [] { init_rc = libssh2_init(0); });
  if (init_rc != 0) return InternalError("libssh2_init failed");

  std::unique_ptr<SshSession> s(new SshSession());
  s->transport_ = std::move(transport);
  s->fd_ = s->transport_->fd();
  s->display_ = opts.host.Display();
  s->timeout_ms_ = std::max(1, opts.connect_timeout_s) * 1000;
  s->keepalive_s_ = opts.keepalive_s;
  SFT_RETURN_IF_ERROR(s->WithTransportProblem(s->Handshake(opts)));
  SFT_RETURN_IF_ERROR(s->WithTransportProblem(s->VerifyHostKey(opts)));
  SFT_RETURN_IF_ERROR(s->WithTransportProblem(s->Authenticate(opts)));
  return s;
}

Status SshSession::WithTransportProblem(const Status& s) {
  // A host key or key refusal is the server's answer, not a transport failure.
  if (s.ok() || s.code() == StatusCode::kUnauthenticated) return s;
  const std::string problem = transport_->Problem();
  return problem.empty() ? s : Status(s.code(), s.message() + " (" + problem + ")");
}

Status SshSession::Handshake(const SessionOptions& opts) {
  session_ = libssh2_session_init();
  if (session_ == nullptr) return InternalError("libssh2_session_init failed");
  libssh2_session_set_blocking(session_, 1);
  libssh2_session_set_timeout(session_, timeout_ms_);
  std::string ciphers = !opts.ciphers.empty()                ? opts.ciphers
                        : !Env("SFTCTL_SSH_CIPHERS").empty() ? Env("SFTCTL_SSH_CIPHERS")
                                                             : kCiphers;
  std::string macs = !opts.macs.empty()                ? opts.macs
                     : !Env("SFTCTL_SSH_MACS").empty() ? Env("SFTCTL_SSH_MACS")
                                                       : kMacs;
  // A preference libssh2 rejects (no name it knows) leaves its default in place.
  (void)libssh2_session_method_pref(session_, LIBSSH2_METHOD_CRYPT_CS, ciphers.c_str());
  (void)libssh2_session_method_pref(session_, LIBSSH2_METHOD_CRYPT_SC, ciphers.c_str());
  (void)libssh2_session_method_pref(session_, LIBSSH2_METHOD_MAC_CS, macs.c_str());
  (void)libssh2_session_method_pref(session_, LIBSSH2_METHOD_MAC_SC, macs.c_str());
  (void)libssh2_session_method_pref(session_, LIBSSH2_METHOD_HOSTKEY, kHostKeys);
  int rc = libssh2_session_handshake(session_, fd_);
  if (rc == LIBSSH2_ERROR_TIMEOUT) {
    return DeadlineExceededError(display_ + ": SSH handshake timed out after " +
                                 std::to_string(opts.connect_timeout_s) + " s");
  }
  if (rc != 0) return UnavailableError(display_ + ": SSH handshake failed: " + LastError());
  return OkStatus();
}

Status SshSession::VerifyHostKey(const SessionOptions& opts) {
  SFT_ASSIGN_OR_RETURN(HostKey key, SessionHostKey(session_));
  const std::string& file = opts.known_hosts_file;
  std::string name = KnownHostsName(opts.host.hostname, opts.host.port);
  SFT_ASSIGN_OR_RETURN(HostKeyState state,
                       CheckKnownHost(session_, file, opts.host.hostname, opts.host.port, key));
  switch (state) {
    case HostKeyState::kMatch:
      return OkStatus();
    case HostKeyState::kMismatch:
      return UnauthenticatedError(
          display_ + ": HOST KEY MISMATCH: the " + key.type_name + " key of " + name + " (" +
          key.fingerprint + ") differs from the one recorded in " + file +
          ". Someone may be intercepting the connection (man-in-the-middle), or the host was reinstalled. "
          "Not authenticating. If the change is expected, remove the old entry with `ssh-keygen -R '" +
          name + "' -f " + file + "` and connect again with --accept-new-host-key");
    case HostKeyState::kOtherTypeKnown:
      return UnauthenticatedError(
          display_ + ": " + name + " is recorded in " + file + " only with key types other than " +
          key.type_name + " (the server offered " + key.fingerprint + "). Not authenticating. Add its " +
          key.type_name + " key to known_hosts (e.g. after checking `ssh-keyscan -t " + key.type_name +
          "`), or remove the old "
          "entries with `ssh-keygen -R '" +
          name + "'` and connect with --accept-new-host-key");
    case HostKeyState::kRevoked:
      return UnauthenticatedError(display_ + ": the " + key.type_name + " host key of " + name + " (" +
                                  key.fingerprint + ") is marked @revoked in " + file +
                                  ". Not authenticating, with or without --accept-new-host-key");
    case HostKeyState::kUnknown:
      break;
  }
  if (!opts.accept_new_host_key) {
    return UnauthenticatedError(display_ + ": unknown host: " + name + " is not in " + file + ". Its " +
                                key.type_name + " host key fingerprint is " + key.fingerprint +
                                ". If that is the host's key, connect again with --accept-new-host-key to "
                                "record it");
  }
  if (Status s = AddKnownHost(session_, file, opts.host.hostname, opts.host.port, key); !s.ok()) {
    return Status(s.code(), display_ + ": cannot record the host key: " + s.message());
  }
  return OkStatus();
}

namespace {

// The keys Authenticate offers, in order, and what became of each: the error that ends a failed
// authentication lists them all (and how to fix an RSA key the server refused).
class KeyAttempts {
 public:
  KeyAttempts(const SshSession& session, LIBSSH2_SESSION* raw, const std::string& user)
      : session_(session), raw_(raw), user_(user) {}

  // Offers the private key in `path` (once; a missing or passphrase-protected one is noted).
  bool TryFile(const std::string& path) {
    for (const auto& t : tried_) {
      if (t.rfind(path + " ", 0) == 0) return false;  // already tried
    }
    if (!FileExists(path)) {
      tried_.push_back(path + " (missing)");
      return false;
    }
    const std::string type = KeyTypeOfFile(path);
    if (KeyFileIsEncrypted(path)) {
      tried_.push_back(path + " (" + type + ", passphrase-protected: add it to ssh-agent with `ssh-add " +
                       path + "`)");
      return false;
    }
    int rc = libssh2_userauth_publickey_fromfile_ex(raw_, user_.c_str(), static_cast<unsigned>(user_.size()),
                                                    nullptr, path.c_str(), nullptr);
    if (rc == 0) return true;
    if (rc == LIBSSH2_ERROR_TIMEOUT || rc == LIBSSH2_ERROR_SOCKET_RECV || rc == LIBSSH2_ERROR_SOCKET_SEND ||
        rc == LIBSSH2_ERROR_SOCKET_DISCONNECT) {
      tried_.push_back(path + " (" + type + ", connection lost: " + session_.LastError() + ")");
      return false;
    }
    bool refused = rc == LIBSSH2_ERROR_PUBLICKEY_UNVERIFIED || rc == LIBSSH2_ERROR_AUTHENTICATION_FAILED;
    tried_.push_back(path + " (" + type + ", " +
                     (refused ? "refused by the server" : "unusable: " + session_.LastError()) + ")");
    if (IsRsaKeyType(type) && rsa_note_.empty()) rsa_note_ = RsaAdvice(path);
    return false;
  }

  // Offers each key of the ssh-agent at `socket` until one is accepted.
  bool TryAgent(const std::string& socket) {
    LIBSSH2_AGENT* agent = libssh2_agent_init(raw_);
    bool ok = false;
    if (agent == nullptr) {
      tried_.push_back("ssh-agent (libssh2 cannot use it)");
    } else if (libssh2_agent_connect(agent) != 0) {
      tried_.push_back("ssh-agent at " + socket + " (cannot connect)");
    } else if (libssh2_agent_list_identities(agent) != 0) {
      tried_.push_back("ssh-agent (cannot list identities)");
    } else {
      libssh2_agent_publickey* id = nullptr;
      int n = 0;
      while (!ok && libssh2_agent_get_identity(agent, &id, id) == 0) {
        ++n;
        std::string type =
            KeyTypeOfBlob(std::string_view(reinterpret_cast<const char*>(id->blob), id->blob_len));
        std::string label =
            std::string("ssh-agent key \"") + (id->comment ? id->comment : "") + "\" (" + type;
        if (libssh2_agent_userauth(agent, user_.c_str(), id) == 0) {
          ok = true;
        } else {
          tried_.push_back(label + ", refused by the server)");
          if (IsRsaKeyType(type) && rsa_note_.empty()) rsa_note_ = RsaAdvice(label + ")");
        }
      }
      if (n == 0) tried_.push_back("ssh-agent (no keys)");
      libssh2_agent_disconnect(agent);
    }
    if (agent != nullptr) libssh2_agent_free(agent);
    return ok;
  }

  // UNAUTHENTICATED, listing every key tried.
  Status Failure(const std::string& hostname) const {
    std::string list;
    for (const auto& t : tried_) list += (list.empty() ? "" : "; ") + t;
    if (list.empty()) {
      list = "none (no -i, no SSH_AUTH_SOCK, no IdentityFile, no ~/.ssh/id_ed25519 or ~/.ssh/id_ecdsa)";
    }
    std::string msg = session_.display() + ": authentication failed for " + user_ + "@" + hostname +
                      "; keys tried: " + list;
    if (!rsa_note_.empty()) msg += ". Note: " + rsa_note_;
    return UnauthenticatedError(msg);
  }

 private:
  const SshSession& session_;
  LIBSSH2_SESSION* raw_;
  const std::string& user_;
  std::vector<std::string> tried_;
  std::string rsa_note_;
};

}  // namespace

// The order OpenSSH uses: -i, the ssh-agent, the config's IdentityFiles, then the default keys.
Status SshSession::Authenticate(const SessionOptions& opts) {
  const std::string& user = opts.host.user;
  char* methods = libssh2_userauth_list(session_, user.c_str(), static_cast<unsigned>(user.size()));
  if (methods == nullptr) {
    if (libssh2_userauth_authenticated(session_)) return OkStatus();  // "none" was accepted
    return UnavailableError(display_ +
                            ": the server closed the connection before authentication: " + LastError());
  }
  if (std::strstr(methods, "publickey") == nullptr) {
    return UnauthenticatedError(display_ + ": the server does not accept public keys (it offers: " +
                                std::string(methods) + "); sftctl authenticates with keys only");
  }
  KeyAttempts keys(*this, session_, user);
  if (!opts.identity_file.empty() && keys.TryFile(opts.identity_file)) return OkStatus();
  if (!opts.agent_socket.empty() && keys.TryAgent(opts.agent_socket)) return OkStatus();
  for (const auto& f : opts.host.identity_files) {
    if (keys.TryFile(f)) return OkStatus();
  }
  // Defaults only when nothing else was configured, like OpenSSH (which skips missing ones silently).
  for (const char* name : {"/.ssh/id_ed25519", "/.ssh/id_ecdsa"}) {
    std::string path = opts.home + name;
    if (FileExists(path) && keys.TryFile(path)) return OkStatus();
  }
  return keys.Failure(opts.host.hostname);
}

StatusOr<LIBSSH2_CHANNEL*> SshSession::OpenChannel(const char* type, const std::string& message) {
  LIBSSH2_CHANNEL* ch = libssh2_channel_open_ex(session_, type, static_cast<unsigned>(std::strlen(type)),
                                                kWindow, kPacket, message.empty() ? nullptr : message.data(),
                                                static_cast<unsigned>(message.size()));
  if (ch == nullptr) {
    int err = libssh2_session_last_errno(session_);
    std::string what = LastError();
    if (err == LIBSSH2_ERROR_CHANNEL_FAILURE) return FailedPreconditionError(what);
    return UnavailableError(display_ + ": cannot open a " + type + " channel: " + what);
  }
  return ch;
}

StatusOr<LIBSSH2_CHANNEL*> SshSession::OpenDirectTcpip(const std::string& host, int port) {
  // RFC 4254 7.2: host to connect, port, originator address, originator port.
  auto put_string = [](std::string* m, const std::string& s) {
    uint32_t n = static_cast<uint32_t>(s.size());
    char b[4] = {char(n >> 24), char(n >> 16), char(n >> 8), char(n)};
    m->append(b, 4);
    m->append(s);
  };
  auto put_u32 = [](std::string* m, uint32_t n) {
    char b[4] = {char(n >> 24), char(n >> 16), char(n >> 8), char(n)};
    m->append(b, 4);
  };
  std::string msg;
  put_string(&msg, host);
  put_u32(&msg, static_cast<uint32_t>(port));
  put_string(&msg, "127.0.0.1");
  put_u32(&msg, 0);
  auto ch = OpenChannel("direct-tcpip", msg);
  if (!ch.ok() && ch.status().code() == StatusCode::kFailedPrecondition) {
    return FailedPreconditionError(display_ + ": the server refused port forwarding to " + host + ":" +
                                   std::to_string(port) + " (" + ch.status().message() + ")");
  }
  return ch;
}

StatusOr<LIBSSH2_CHANNEL*> SshSession::OpenExecChannel(const std::string& command) {
  auto ch = OpenChannel("session", "");
  if (!ch.ok()) {
    if (ch.status().code() == StatusCode::kFailedPrecondition) {
      return UnavailableError(display_ + ": the server refused a session channel (" + ch.status().message() +
                              ")");
    }
    return ch.status();
  }
  if (libssh2_channel_process_startup(*ch, "exec", 4, command.data(),
                                      static_cast<unsigned>(command.size())) != 0) {
    std::string err = LastError();
    libssh2_channel_free(*ch);
    return UnavailableError(display_ + ": cannot run `" + command + "`: " + err);
  }
  return ch;
}

StatusOr<ExecResult> SshSession::Exec(const std::string& command, const std::string& input, int timeout_s) {
  libssh2_session_set_timeout(session_, std::max(timeout_s * 1000, timeout_ms_));
  SFT_ASSIGN_OR_RETURN(LIBSSH2_CHANNEL * ch, OpenExecChannel(command));
  ExecResult r;
  char buf[16384];
  Status failure = OkStatus();
  for (size_t off = 0; off < input.size();) {
    ssize_t n = libssh2_channel_write(ch, input.data() + off, std::min<size_t>(input.size() - off, 65536));
    if (n < 0) {
      failure = UnavailableError(display_ + ": writing the input of `" + command + "`: " + LastError());
      break;
    }
    off += static_cast<size_t>(n);
  }
  if (failure.ok() && libssh2_channel_send_eof(ch) != 0) {
    failure = UnavailableError(display_ + ": closing the input of `" + command + "`: " + LastError());
  }
  if (!failure.ok()) {
    libssh2_channel_free(ch);
    libssh2_session_set_timeout(session_, timeout_ms_);
    return failure;
  }
  // The host is not trusted: its answer to a setup command is small, and a flood is an error, not a
  // reason to grow without bound.
  auto take = [&](std::string* into, ssize_t n) {
    if (into->size() + static_cast<size_t>(n) > kMaxExecOutputBytes) {
      failure = ResourceExhaustedError(display_ + ": `" + command + "` printed more than " +
                                       std::to_string(kMaxExecOutputBytes >> 20) + " MiB");
      return false;
    }
    into->append(buf, static_cast<size_t>(n));
    return true;
  };
  // Read stdout and stderr alternately so neither fills the window while the other is read.
  for (;;) {
    ssize_t n = libssh2_channel_read(ch, buf, sizeof(buf));
    if (n > 0) {
      if (!take(&r.out, n)) break;
      continue;
    }
    ssize_t e = libssh2_channel_read_stderr(ch, buf, sizeof(buf));
    if (e > 0) {
      if (!take(&r.err, e)) break;
      continue;
    }
    if (n < 0 && n != LIBSSH2_ERROR_EAGAIN) {
      failure =
          n == LIBSSH2_ERROR_TIMEOUT
              ? DeadlineExceededError(display_ + ": `" + command + "` did not finish within " +
                                      std::to_string(timeout_s) + " s")
              : UnavailableError(display_ + ": reading the output of `" + command + "`: " + LastError());
      break;
    }
    if (libssh2_channel_eof(ch)) break;
  }
  if (failure.ok()) {
    libssh2_channel_close(ch);
    libssh2_channel_wait_closed(ch);
    char* sig = nullptr;
    libssh2_channel_get_exit_signal(ch, &sig, nullptr, nullptr, nullptr, nullptr, nullptr);
    r.exit_code = sig != nullptr ? -1 : libssh2_channel_get_exit_status(ch);
    if (sig != nullptr) libssh2_free(session_, sig);
  }
  libssh2_channel_free(ch);
  libssh2_session_set_timeout(session_, timeout_ms_);
  SFT_RETURN_IF_ERROR(failure);
  return r;
}

}  // namespace sftctl::client::ssh
