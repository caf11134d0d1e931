#include "client/remote/ssh/remote_agent.h"

#include <arpa/inet.h>
#include <grpcpp/create_channel_posix.h>
#include <netinet/in.h>
#include <pwd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>

#include "client/remote/ssh/agent_identity_check.h"
#include "client/remote/ssh/channel_pump.h"
#include "client/remote/ssh/ssh_config.h"
#include "client/remote/ssh/ssh_route.h"
#include "client/remote/ssh/ssh_session.h"
#include "common/json_parse.h"
#include "common/mutex.h"
#include "common/rpc_limits.h"
#include "common/source_id.h"
#include "common/terminal_text.h"
#include "common/version.h"

namespace sftctl::client {
namespace {

using ssh::ChannelPump;
using ssh::SshSession;

// A path for the remote shell: "~/x" becomes "$HOME"/'x'; everything else is quoted as is.
std::string RemotePath(const std::string& p) {
  if (p.rfind("~/", 0) == 0) return "\"$HOME\"/" + ShellQuote(p.substr(2));
  return ShellQuote(p);
}

std::string LocalHome() {
  if (const char* h = std::getenv("HOME"); h != nullptr && *h) return h;
  passwd* pw = ::getpwuid(::getuid());
  return pw != nullptr && pw->pw_dir != nullptr ? pw->pw_dir : "/";
}

std::string LocalUser() {
  passwd* pw = ::getpwuid(::getuid());
  if (pw != nullptr && pw->pw_name != nullptr) return pw->pw_name;
  const char* u = std::getenv("USER");
  return u != nullptr ? u : "root";
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// The last line of `text` that starts with `prefix`, without the prefix; empty if none.
std::string LineAfter(const std::string& text, const std::string& prefix) {
  size_t pos = 0;
  std::string found;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    if (line.rfind(prefix, 0) == 0) found = Trim(line.substr(prefix.size()));
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  return found;
}

// What `sftd status --json` or the SFTD_READY line says about the agent.
struct AgentInfo {
  std::string sftd;  // the remote command that runs sftd (shell syntax)
  std::string host;  // where the agent listens on the host: an address literal, IPv6 without brackets
  int port = 0;
  std::string token_file;
  std::string version;
  std::string source_id;  // empty from an agent older than source ids
  std::string token;      // from `status --with-token`; empty from an agent older than that flag
};

// "127.0.0.1:41234" or "[::1]:41234" -> host (IPv6 without brackets) and port; false unless the
// host is an IP address literal and the port is in 1..65535. The text comes from the host, which
// is not trusted.
bool SplitAgentAddr(const std::string& addr, std::string* host, int* port) {
  size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon + 1 >= addr.size() || addr.size() - colon > 6) return false;
  std::string h = addr.substr(0, colon), p = addr.substr(colon + 1);
  if (p.find_first_not_of("0123456789") != std::string::npos) return false;
  *port = std::atoi(p.c_str());
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  in_addr a4{};
  in6_addr a6{};
  if (::inet_pton(AF_INET, h.c_str(), &a4) != 1 && ::inet_pton(AF_INET6, h.c_str(), &a6) != 1) return false;
  *host = h;
  return *port > 0 && *port <= 65535;
}

// `sftd status --json --with-token` output as an error may quote it: without the token's value.
std::string RedactToken(const std::string& text) {
  static const std::regex kToken("\"token\"\\s*:\\s*\"[^\"]*\"?");
  return std::regex_replace(text, kToken, "\"token\": \"(redacted)\"");
}

Status ParseAgentJson(const std::string& display, const std::string& what, const std::string& text,
                      AgentInfo* info, bool* running) {
  // (Errors quote at most 512 bytes of it, without the token; ReportError escapes them for the terminal.)
  const std::string shown = RedactToken(text).substr(0, 512);
  auto j = ParseJson(text, what);
  auto r = j.ok() && j->is_object() ? j->find("running") : nlohmann::json::iterator();
  if (!j.ok() || !j->is_object() || (r != j->end() && !r->is_boolean())) {
    return InternalError(display + ": unexpected output from `" + what + "`: " + shown);
  }
  const auto str = [&](const char* key) {
    auto it = j->find(key);
    return it != j->end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  *running = r == j->end() || r->get<bool>();
  if (!*running) return OkStatus();
  info->token_file = str("token_file");
  info->version = str("version");
  info->source_id = str("source_id");
  info->token = str("token");
  if (!SplitAgentAddr(str("addr"), &info->host, &info->port) || info->token_file.empty() ||
      info->token_file.find('\n') != std::string::npos) {
    return InternalError(display + ": `" + what + "` gave no usable agent address or token file: " + shown);
  }
  return OkStatus();
}

// A bearer token is printable ASCII (sftd makes 64 hex digits); anything else from the host is refused
// before it reaches gRPC metadata.
bool PlausibleToken(const std::string& t) {
  if (t.empty() || t.size() > 1024) return false;
  for (char c : t) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

// Finds sftd on the host, starts the agent when needed and allowed; fills `info`.
Status FindAgent(SshSession& session, const ConnectOptions& opts, int timeout_s, AgentInfo* info) {
  const std::string& display = session.display();
  std::string dd = opts.agent_data_dir.empty() ? "" : " --data-dir " + RemotePath(opts.agent_data_dir);
  std::vector<std::string> candidates;
  if (!opts.sftd.empty()) {
    candidates.push_back(RemotePath(opts.sftd));
  } else {
    candidates = {"sftd", "\"$HOME\"/.local/bin/sftd"};
  }
  std::string status_out;
  for (const auto& c : candidates) {
    // The token comes with the status: one remote command instead of two. An sftd older than
    // --with-token refuses the flag; it is asked again without it (FindAgentAndToken then reads the
    // token file).
    SFT_ASSIGN_OR_RETURN(ssh::ExecResult r, session.Exec(c + " status --json --with-token" + dd, timeout_s));
    if (r.exit_code == 127 || r.exit_code == 126) continue;  // not found / not executable
    if (r.exit_code != 0 && r.exit_code != 3) {
      SFT_ASSIGN_OR_RETURN(r, session.Exec(c + " status --json" + dd, timeout_s));
    }
    if (r.exit_code != 0 && r.exit_code != 3) {
      return UnavailableError(display + ": `" + c + " status` failed (exit " + std::to_string(r.exit_code) +
                              "): " + RedactToken(Trim(r.err + r.out)).substr(0, 1024));
    }
    info->sftd = c;
    status_out = Trim(r.out);
    break;
  }
  if (info->sftd.empty()) {
    if (!opts.sftd.empty()) {
      return NotFoundError(display + ": sftd is not installed on the host: " + opts.sftd +
                           " cannot be run there. Check the path given with --sftd");
    }
    return NotFoundError(
        display +
        ": sftd is not installed on the host (tried `sftd` on the PATH of a non-interactive SSH "
        "command and ~/.local/bin/sftd). Set the host up with `sftctl bootstrap --host " +
        opts.host + "` (or add --bootstrap to `sftctl submit`), or pass its path with --sftd /path/to/sftd");
  }
  bool running = false;
  SFT_RETURN_IF_ERROR(ParseAgentJson(display, info->sftd + " status --json", status_out, info, &running));
  if (running) return OkStatus();
  if (!opts.start_agent) {
    return FailedPreconditionError(display +
                                   ": sftd is not running on the host (start it there with `sftd start "
                                   "--detach`, or let sftctl start it)");
  }
  std::string cmd = info->sftd + " start --detach" + dd;
  SFT_ASSIGN_OR_RETURN(ssh::ExecResult r, session.Exec(cmd, std::max(timeout_s, 60)));
  std::string ready = LineAfter(r.out, "SFTD_READY ");
  if (r.exit_code != 0 || ready.empty()) {
    std::string why = LineAfter(r.err, "SFTD_ERROR ");
    return UnavailableError(display + ": starting the agent (`" + cmd + "`) failed (exit " +
                            std::to_string(r.exit_code) + "): " + (why.empty() ? Trim(r.err + r.out) : why));
  }
  SFT_RETURN_IF_ERROR(ParseAgentJson(display, cmd, ready, info, &running));
  return OkStatus();
}

// The agent must be built from this client's source when opts.require_same_source (submit: the
// trainer and the spec format travel with it); other commands only warn.
Status CheckAgentSource(const std::string& display, const ConnectOptions& opts, const AgentInfo& info) {
  const std::string mine = SourceId();
  if (info.version == kVersion && info.source_id == mine) return OkStatus();
  const std::string theirs =
      "sftd " + EscapeForTerminal(info.version.empty() ? std::string("?") : info.version.substr(0, 40)) +
      " (source " +
      (info.source_id.empty() ? std::string("unknown") : EscapeForTerminal(info.source_id.substr(0, 12))) +
      ")";
  const std::string msg = display + ": the host runs " + theirs + " and this is sftctl " + kVersion +
                          " (source " + mine.substr(0, 12) +
                          "). Update the host with `sftctl bootstrap --host " + opts.host +
                          "`, or add --bootstrap to `sftctl submit`";
  if (opts.require_same_source) return FailedPreconditionError(msg);
  // Once per process (reconnects would repeat it); connections on several threads may get here.
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) std::cerr << "warning: " << msg << "\n";
  return OkStatus();
}

class SshAgentConnection : public AgentConnection {
 public:
  SshAgentConnection(std::unique_ptr<ChannelPump> pump, std::shared_ptr<grpc::Channel> channel,
                     std::string token, std::string description, std::string host)
      : pump_(std::move(pump)),
        channel_(std::move(channel)),
        token_(std::move(token)),
        description_(std::move(description)),
        host_(std::move(host)) {}
  ~SshAgentConnection() override {
    pump_.reset();  // gRPC sees EOF: every pending call ends UNAVAILABLE
    channel_.reset();
  }
  std::shared_ptr<grpc::Channel> channel() const override { return channel_; }
  const std::string& token() const override { return token_; }
  std::string description() const override { return description_; }
  const std::string& host() const override { return host_; }
  // Why the tunnel stopped and what `sftd bridge` said on stderr, for error messages.
  std::string TransportProblem() const {
    std::string p = pump_->failure();
    std::string e = pump_->stderr_tail();
    while (!e.empty() && e.back() == '\n') e.pop_back();
    if (!e.empty()) p += (p.empty() ? "" : "; ") + std::string("remote stderr: ") + e;
    return p;
  }

 private:
  std::unique_ptr<ChannelPump> pump_;
  std::shared_ptr<grpc::Channel> channel_;
  std::string token_, description_, host_;
};

// How every hop of the route connects: the user's keys, known_hosts, timeouts; warnings to stderr.
ssh::RouteOptions RouteOptionsFor(const ConnectOptions& opts, const std::string& home,
                                  const std::string& config, const std::string& local_user) {
  ssh::RouteOptions route;
  ssh::SessionOptions& so = route.session;
  so.identity_file = ssh::ExpandTilde(opts.identity_file, home);
  if (const char* sock = std::getenv("SSH_AUTH_SOCK"); sock != nullptr) so.agent_socket = sock;
  so.home = home;
  so.known_hosts_file = opts.known_hosts_file.empty() ? home + "/.ssh/known_hosts"
                                                      : ssh::ExpandTilde(opts.known_hosts_file, home);
  so.accept_new_host_key = opts.accept_new_host_key;
  so.keepalive_s = opts.keepalive_s;
  so.connect_timeout_s = opts.connect_timeout_s;
  route.config_file = config;
  route.home = home;
  route.local_user = local_user;
  route.warn = [](const std::string& w) { std::cerr << "warning: " << w << "\n"; };
  return route;
}

// FindAgent, the source check and the agent's token, read through `session`.
StatusOr<std::string> FindAgentAndToken(SshSession& session, const ConnectOptions& opts, int timeout_s,
                                        AgentInfo* agent) {
  const std::string display = session.display();
  SFT_RETURN_IF_ERROR(FindAgent(session, opts, timeout_s, agent));
  SFT_RETURN_IF_ERROR(CheckAgentSource(display, opts, *agent));
  // The token travels through the session only; it is never written on this machine.
  std::string token = agent->token;
  if (token.empty()) {
    SFT_ASSIGN_OR_RETURN(ssh::ExecResult tok,
                         session.Exec("cat -- " + RemotePath(agent->token_file), timeout_s));
    token = Trim(tok.out);
    if (tok.exit_code != 0 || token.empty()) {
      return PermissionDeniedError(display + ": cannot read the agent token " + agent->token_file + ": " +
                                   Trim(tok.err));
    }
  }
  if (!PlausibleToken(token)) {
    return InternalError(display + ": the agent token in " + agent->token_file +
                         " is not a token (expected printable ASCII without spaces)");
  }
  return token;
}

}  // namespace

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// What a connection learned of an agent (FindAgent and its token), kept in ConnectOptions::known_agents
// for the later connections made with those options: a parallel pull's extra connections and reconnects
// then skip the `sftd status`
// and `cat token` commands (two remote processes and several round trips each). Checked
// by the Version() call every connection makes; forgotten when that fails.
struct KnownAgent {
  AgentInfo info;
  std::string token;
  bool bridge = false;  // reached through `sftd bridge` (the server refuses forwarding)
};

class KnownAgents {
 public:
  static std::string Key(const ConnectOptions& o) {
    return o.host + '\n' + o.identity_file + '\n' + o.sftd + '\n' + o.agent_data_dir +
           (o.require_same_source ? "\nsame-source" : "");
  }
  std::optional<KnownAgent> Find(const ConnectOptions& o) EXCLUDES(mu_) {
    MutexLock l(&mu_);
    auto it = known_.find(Key(o));
    if (it == known_.end()) return std::nullopt;
    return it->second;
  }
  void Remember(const ConnectOptions& o, KnownAgent k) EXCLUDES(mu_) {
    MutexLock l(&mu_);
    known_[Key(o)] = std::move(k);
  }
  void Forget(const ConnectOptions& o) EXCLUDES(mu_) {
    MutexLock l(&mu_);
    known_.erase(Key(o));
  }

 private:
  Mutex mu_;
  std::map<std::string, KnownAgent> known_ GUARDED_BY(mu_);
};

std::shared_ptr<KnownAgents> NewKnownAgents() { return std::make_shared<KnownAgents>(); }

StatusOr<std::unique_ptr<ssh::SshSession>> OpenSshSession(const ConnectOptions& opts) {
  const std::string home = LocalHome();
  std::string config =
      opts.ssh_config_file.empty() ? home + "/.ssh/config" : ssh::ExpandTilde(opts.ssh_config_file, home);
  const std::string local_user = LocalUser();
  SFT_ASSIGN_OR_RETURN(ssh::ResolvedHost host, ssh::ResolveHost(opts.host, config, home, local_user));

  const ssh::RouteOptions route = RouteOptionsFor(opts, home, config, local_user);
  // A direct connection, the host's ProxyCommand, or its ProxyJump chain (ssh_route.h).
  return ssh::ConnectRoute(host, route);
}

namespace {

// One connection: an SSH session, then the agent as `known` describes it (null: asked on the host).
// *reached: the SSH session was up (what failed, if anything, was the agent part).
StatusOr<std::unique_ptr<AgentConnection>> ConnectOnce(const ConnectOptions& opts,
                                                       const KnownAgent* known_agent, bool* reached) {
  SFT_ASSIGN_OR_RETURN(std::unique_ptr<SshSession> session, OpenSshSession(opts));
  *reached = true;
  const std::string display = session->display();
  const int timeout_s = std::max(1, opts.connect_timeout_s);
  std::string through;
  for (const auto& hop : session->hops()) through += (through.empty() ? " through " : ", then ") + hop;

  std::optional<KnownAgent> known;
  if (known_agent != nullptr) known = *known_agent;
  if (!known) {
    KnownAgent k;
    SFT_ASSIGN_OR_RETURN(k.token, FindAgentAndToken(*session, opts, timeout_s, &k.info));
    known = std::move(k);
  }
  const AgentInfo& agent = known->info;
  const std::string& token = known->token;

  // Transport ladder: direct-tcpip, else (server refuses forwarding) `sftd bridge` on an exec channel.
  std::string dd = opts.agent_data_dir.empty() ? "" : " --data-dir " + RemotePath(opts.agent_data_dir);
  LIBSSH2_CHANNEL* ch = nullptr;
  std::string via;
  bool bridge = opts.transport == Transport::kBridge || known->bridge;
  if (!bridge) {
    auto fwd = session->OpenDirectTcpip(agent.host, agent.port);
    if (fwd.ok()) {
      ch = *fwd;
      via = "direct-tcpip";
    } else if (opts.transport == Transport::kForward || known_agent != nullptr ||
               fwd.status().code() != StatusCode::kFailedPrecondition) {
      return fwd.status();  // (a remembered address that fails: the caller asks the host again)
    } else {
      bridge = true;
      via = "sftd bridge (the server refused port forwarding)";
    }
  }
  if (bridge) {
    SFT_ASSIGN_OR_RETURN(ch, session->OpenExecChannel(agent.sftd + " bridge" + dd));
    if (via.empty()) via = "sftd bridge";
  }
  std::string description = display + through + " via " + via + " (" + session->negotiated() + ")";

  SFT_ASSIGN_OR_RETURN(std::unique_ptr<ChannelPump> pump, ChannelPump::Start(std::move(session), ch, bridge));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxRpcMessageBytes);
  // A fixed 8 MiB HTTP/2 stream window instead of BDP probing: the probe's pings queue behind the
  // data in the tunnel's buffers, and the window it picked made 1 GiB pulls stall erratically
  // (45-215 MiB/s from run to run on loopback; steady ~200 MiB/s with the fixed window).
  // (gRPC 1.51 still caps a connection at about 1 MiB per round trip: see client/transfer/range_pull.h.)
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomInsecureChannelFromFd("sftd", pump->TakeClientFd(), args);
  auto conn = std::make_unique<SshAgentConnection>(std::move(pump), channel, token, description, opts.host);

  // The agent proves itself before the token is sent, then must answer before the connection is
  // handed out.
  // A remembered address never gets the legacy allowance: the agent there may be another program.
  const bool legacy_ok = known_agent == nullptr && agent.source_id != SourceId();
  SFT_RETURN_IF_ERROR(CheckAgentIdentity(*conn, agent.host + ":" + std::to_string(agent.port), legacy_ok,
                                         timeout_s, display + " (through " + via + ")"));
  auto stub = conn->NewStub();
  grpc::ClientContext ctx;
  conn->Authorize(&ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
  v1::VersionResponse v;
  grpc::Status gs = stub->Version(&ctx, v1::VersionRequest(), &v);
  if (!gs.ok()) {
    std::string problem = conn->TransportProblem();
    return UnavailableError(display + ": the agent did not answer Version() through " + via + ": " +
                            gs.error_message() + (problem.empty() ? "" : " (" + problem + ")"));
  }
  known->bridge = bridge;
  if (opts.known_agents) opts.known_agents->Remember(opts, *known);
  return std::unique_ptr<AgentConnection>(std::move(conn));
}

}  // namespace

StatusOr<std::unique_ptr<AgentConnection>> ConnectOverSsh(const ConnectOptions& opts) {
  bool reached = false;
  std::optional<KnownAgent> k = opts.known_agents ? opts.known_agents->Find(opts) : std::nullopt;
  if (k) {
    auto conn = ConnectOnce(opts, &*k, &reached);
    if (conn.ok() || !reached) return conn;
    opts.known_agents->Forget(opts);  // the agent moved or restarted since: ask the host again
  }
  return ConnectOnce(opts, nullptr, &reached);
}

}  // namespace sftctl::client
