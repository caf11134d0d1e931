// AgentConnection: a live gRPC connection to one sftd, reached over SSH (client/remote/ssh/) or, for the
// host names "local" and "localhost", directly on this machine (client/remote/local_agent.h).
//
// Thread safety: an AgentConnection may be used from several threads for gRPC calls; creating and
// destroying it is not thread-safe. Ownership: the connection owns whatever keeps its transport up (an
// SSH session and its pump thread); every stub made from channel() must be destroyed first.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "common/status.h"
#include "sftctl/v1/agent.grpc.pb.h"

namespace sftctl::client {

class KnownAgents;  // ssh/remote_agent.cpp

enum class Transport {
  kAuto,     // direct-tcpip forwarding, else an exec channel running `sftd bridge`
  kForward,  // direct-tcpip only (fail if the server refuses forwarding)
  kBridge,   // `sftd bridge` only
};

struct ConnectOptions {
  // "[user@]host[:port]", an ~/.ssh/config Host alias, or "local"/"localhost" (this machine's agent,
  // no SSH) or "local:<data_dir>" (the local agent of that data dir). Anything else goes through SSH,
  // including user@127.0.0.1.
  std::string host;
  std::string identity_file;         // -i; empty: ssh-agent, IdentityFile from ssh config, ~/.ssh/id_*
  bool accept_new_host_key = false;  // like StrictHostKeyChecking=accept-new: record an unknown key
  std::string known_hosts_file;      // empty: ~/.ssh/known_hosts
  std::string ssh_config_file;       // empty: ~/.ssh/config (missing file = no aliases)
  std::string sftd;                  // sftd on the host; empty: "sftd" on PATH, then ~/.local/bin/sftd
  std::string agent_data_dir;        // sftd --data-dir on the host; empty: sftd's default
  bool start_agent = true;           // start the agent (`sftd start --detach`) when it is not running
  // Refuse (FAILED_PRECONDITION) an agent built from another source than this client (`submit`);
  // otherwise a mismatch is a warning on stderr. SSH hosts only (a local agent is this build's).
  bool require_same_source = false;
  Transport transport = Transport::kAuto;
  int keepalive_s = 15;
  int connect_timeout_s = 20;
  // What connections made with these options (and their copies) learned of an agent over SSH, so
  // reconnects and a transfer's extra connections skip finding it again; null: each connection asks
  // the host. MakeSessionFactory (agent_session.h) gives its connections one; NewKnownAgents
  // (ssh/remote_agent.h) makes one.
  std::shared_ptr<KnownAgents> known_agents;
};

class AgentConnection {
 public:
  virtual ~AgentConnection() = default;

  // The channel to the agent; valid for the connection's lifetime.
  virtual std::shared_ptr<grpc::Channel> channel() const = 0;
  // The agent's bearer token (read through the SSH session; never written on this machine).
  virtual const std::string& token() const = 0;
  // e.g. "ubuntu@gpu-box:22 via direct-tcpip" or "local agent (~/.local/share/sftd)".
  virtual std::string description() const = 0;
  // The name to record in the job registry to reach this agent again (ConnectOptions::host).
  virtual const std::string& host() const = 0;

  std::unique_ptr<v1::Agent::StubInterface> NewStub() const { return v1::Agent::NewStub(channel()); }
  // Adds "authorization: Bearer <token>" to a call's metadata.
  void Authorize(grpc::ClientContext* ctx) const { ctx->AddMetadata("authorization", "Bearer " + token()); }
};

// True for the host names that mean this machine's agent without SSH ("local", "localhost",
// "local:<data_dir>").
bool IsLocalAgentHost(const std::string& host);

// ConnectToAgent (client/remote/agent_session.h) picks the implementation: local_agent.h or
// ssh/remote_agent.h.

}  // namespace sftctl::client
