#include "client/remote/ssh/ssh_route.h"

#include <unistd.h>

#include "client/remote/ssh/channel_pump.h"
#include "client/remote/ssh/proxy_command.h"
#include "client/remote/ssh/ssh_transport.h"

namespace sftctl::client::ssh {
namespace {

constexpr int kMaxHops = 8;

// The stream to a host behind a jump host: a direct-tcpip channel of the jump host's session, relayed
// by a ChannelPump into a socketpair.
class JumpTransport : public SshTransport {
 public:
  JumpTransport(std::unique_ptr<ChannelPump> pump, std::string jump_display, std::vector<std::string> hops)
      : pump_(std::move(pump)),
        fd_(pump_->TakeClientFd()),
        jump_(std::move(jump_display)),
        hops_(std::move(hops)) {}
  ~JumpTransport() override {
    ::close(fd_);   // the pump sees EOF and closes the channel
    pump_.reset();  // joins the relay thread, frees the jump host's session (and its own transport)
  }
  int fd() const override { return fd_; }
  std::vector<std::string> Hops() const override { return hops_; }
  std::string Problem() override {
    const std::string f = pump_->failure();
    return f.empty() ? "" : "jump host " + jump_ + ": " + f;
  }

 private:
  std::unique_ptr<ChannelPump> pump_;
  const int fd_;
  const std::string jump_;
  const std::vector<std::string> hops_;
};

SessionOptions HopOptions(const ResolvedHost& h, const RouteOptions& o) {
  SessionOptions so = o.session;
  so.host = h;
  return so;
}

// A channel from `jump` to host:port, relayed into a transport.
StatusOr<std::unique_ptr<SshTransport>> OpenJump(std::unique_ptr<SshSession> jump, const std::string& host,
                                                 int port) {
  const std::string jd = jump->display();
  auto ch = jump->OpenDirectTcpip(host, port);
  if (!ch.ok()) {
    // "administratively prohibited": the jump host forbids forwarding (a setting, not a hiccup).
    const bool prohibited = ch.status().message().find("prohibited") != std::string::npos;
    return Status(prohibited ? StatusCode::kFailedPrecondition : StatusCode::kUnavailable,
                  "cannot reach " + host + ":" + std::to_string(port) + " through jump host " + jd + ": " +
                      ch.status().message());
  }
  std::vector<std::string> hops = jump->hops();
  hops.push_back("jump host " + jd);
  SFT_ASSIGN_OR_RETURN(std::unique_ptr<ChannelPump> pump,
                       ChannelPump::Start(std::move(jump), *ch, /*capture_stderr=*/false, "the target host"));
  return std::unique_ptr<SshTransport>(new JumpTransport(std::move(pump), jd, std::move(hops)));
}

StatusOr<std::unique_ptr<SshSession>> ConnectHop(const ResolvedHost& h, const RouteOptions& o, int depth);

// The session to the last jump host of h's ProxyJump chain.
StatusOr<std::unique_ptr<SshSession>> ConnectJumpChain(const ResolvedHost& h, const RouteOptions& o,
                                                       int depth) {
  std::unique_ptr<SshSession> jump;
  for (size_t i = 0; i < h.proxy_jump.size(); ++i) {
    SFT_ASSIGN_OR_RETURN(ResolvedHost hop,
                         ResolveHostSpec(h.proxy_jump[i], o.config_file, o.home, o.local_user));
    if (o.warn) {
      for (const auto& w : hop.warnings) o.warn(w);
    }
    if (i == 0) {
      // A host cannot be its own jump host: `Host *` + ProxyJump also matches the jump host itself.
      if (hop.alias == h.alias) {
        hop.proxy_jump.clear();
        hop.proxy_command.clear();
      }
      SFT_ASSIGN_OR_RETURN(jump, ConnectHop(hop, o, depth + 1));
    } else {
      SFT_ASSIGN_OR_RETURN(std::unique_ptr<SshTransport> t,
                           OpenJump(std::move(jump), hop.hostname, hop.port));
      SFT_ASSIGN_OR_RETURN(jump, SshSession::ConnectOver(std::move(t), HopOptions(hop, o)));
    }
  }
  return jump;
}

StatusOr<std::unique_ptr<SshTransport>> OpenTransport(const ResolvedHost& h, const RouteOptions& o,
                                                      int depth) {
  if (!h.proxy_command.empty()) return StartProxyCommand(h.proxy_command);
  if (h.proxy_jump.empty()) {
    return ConnectTcp(h.hostname, h.port, std::max(1, o.session.connect_timeout_s) * 1000, h.Display());
  }
  if (depth >= kMaxHops) {
    return InvalidArgumentError(h.Display() + ": more than " + std::to_string(kMaxHops) +
                                " ProxyJump hops (do jump hosts in the ssh config name each other?)");
  }
  SFT_ASSIGN_OR_RETURN(std::unique_ptr<SshSession> jump, ConnectJumpChain(h, o, depth));
  return OpenJump(std::move(jump), h.hostname, h.port);
}

StatusOr<std::unique_ptr<SshSession>> ConnectHop(const ResolvedHost& h, const RouteOptions& o, int depth) {
  SFT_ASSIGN_OR_RETURN(std::unique_ptr<SshTransport> t, OpenTransport(h, o, depth));
  return SshSession::ConnectOver(std::move(t), HopOptions(h, o));
}

}  // namespace

StatusOr<std::unique_ptr<SshSession>> ConnectRoute(const ResolvedHost& target, const RouteOptions& opts) {
  if (opts.warn) {
    for (const auto& w : target.warnings) opts.warn(w);
  }
  return ConnectHop(target, opts, /*depth=*/0);
}

}  // namespace sftctl::client::ssh
