// AgentSession and Reconnector: the gRPC stub the remote commands call through, and the retry loop
// that survives a dropped connection (an SSH tunnel going away mid-stream).
//
// Commands connect once up front (an unreachable host is reported at once, exit 4); after that a
// Reconnector owns the session and every remote call goes through its one loop (Reconnector::Run,
// or WithRetry for a single call): when a call fails with a transient error, it drops the session,
// waits an exponential backoff and connects again through its SessionFactory, within a bounded number
// of attempts and time since the last progress.
//
// Thread safety: an AgentSession may be used from several threads for calls (like the connection it
// wraps); a Reconnector is used by one thread at a time.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "client/remote/agent_connection.h"
#include "common/os/clock.h"
#include "common/status.h"
#include "sftctl/v1/agent.grpc.pb.h"

namespace sftctl::client {

// Connects to the agent named by opts.host (starting it when opts.start_agent): this machine's
// (IsLocalAgentHost, local_agent.h) or one over SSH (ssh/remote_agent.h); reads its token and checks
// that it answers Version(). Errors name the host and the step that failed (SSH connect, host key,
// authentication, starting sftd, forwarding), e.g. UNAUTHENTICATED "ubuntu@box: host key ...".
StatusOr<std::unique_ptr<AgentConnection>> ConnectToAgent(const ConnectOptions& opts);

namespace v1 = ::sftctl::v1;

// One connected agent: its stub, token and the connection keeping the transport up.
class AgentSession {
 public:
  // Takes a live connection and makes a stub on its channel.
  explicit AgentSession(std::unique_ptr<AgentConnection> conn);
  // Tests: any stub (e.g. on an in-process server) with the token to send.
  AgentSession(std::unique_ptr<v1::Agent::StubInterface> stub, std::string token, std::string host);
  AgentSession(const AgentSession&) = delete;
  AgentSession& operator=(const AgentSession&) = delete;

  v1::Agent::StubInterface* stub() const { return stub_.get(); }
  // The registry name of the host (ConnectOptions::host as the connection reports it).
  const std::string& host() const { return host_; }
  std::string description() const { return description_; }
  // Adds the bearer token and, when timeout > 0, a deadline of now + timeout.
  void Prepare(grpc::ClientContext* ctx, std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;

 private:
  // Declared before stub_ so the stub is destroyed first (the connection must outlive it).
  std::unique_ptr<AgentConnection> conn_;
  std::unique_ptr<v1::Agent::StubInterface> stub_;
  std::string token_, host_, description_;
};

using SessionFactory = std::function<StatusOr<std::unique_ptr<AgentSession>>()>;

// Connects with ConnectToAgent(opts). Errors carry the host name. Its connections share one
// KnownAgents (opts.known_agents, or a new one), so each finds the agent on the host only once.
SessionFactory MakeSessionFactory(const ConnectOptions& opts);

// A gRPC status as a Status, the message prefixed with `context` when given.
Status FromGrpc(const grpc::Status& s, const std::string& context = "");

// True for failures a new connection may cure: UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, UNKNOWN,
// CANCELLED (not asked for by us), ABORTED.
bool IsTransient(const Status& s);

struct RetryPolicy {
  int max_attempts = 8;  // consecutive failed attempts without progress
  std::chrono::milliseconds initial_backoff{200};
  std::chrono::milliseconds max_backoff{5000};
  std::chrono::seconds max_time{180};  // since the last progress
  // What the time since the last progress is read on and the back-off slept on; not owned, lives
  // as long as the reconnectors (tests pass an OffsetClock).
  const Clock* clock = Clock::Real();
};

// How one attempt of Reconnector::Run ended.
struct Attempt {
  Status status;       // OK: the work is done
  bool final = false;  // end the loop with `status` as is, not reconnecting (a local error, a broken rule)
  bool progressed = false;  // bytes or events arrived during the attempt: the retry budget starts over
};

class Reconnector {
 public:
  // `first` (may be null) is the session to start with; `factory` makes later ones.
  Reconnector(std::unique_ptr<AgentSession> first, SessionFactory factory, RetryPolicy policy = {});

  // The reconnect loop, the one way the client resumes work over a dropped connection: runs `attempt`
  // on the current session (connecting through the factory first when there is none; a failure to
  // connect counts as a failed attempt) until an attempt ends OK or final, and returns its status.
  // After any other failure the session is dropped; when the failure is transient (IsTransient) and
  // the budget allows (fewer than max_attempts failures, less than max_time since the last progress),
  // it sleeps the back-off on policy.clock (initial_backoff doubling per failure, at most max_backoff)
  // and tries again; else it gives up: a transient failure after retries becomes UNAVAILABLE "lost the
  // connection to HOST and could not resume after N attempt(s): ...", any other is returned as is.
  // `attempt` must resume where the last one stopped (or be idempotent).
  Status Run(const std::function<Attempt(AgentSession&)>& attempt);

  // Resets the attempt budget (bytes or events arrived since the last failure).
  void MadeProgress();
  int reconnects() const { return reconnects_; }
  // Reconnects made for this one's work by helper connections (parallel pulls), for NoteReconnects.
  void AddReconnects(int n) { reconnects_ += n; }
  const std::string& host() const { return host_; }
  // How further sessions are made, and the retry budget: for more connections to the same agent.
  const SessionFactory& factory() const { return factory_; }
  const RetryPolicy& policy() const { return policy_; }

 private:
  // The current session, connecting through the factory when there is none.
  StatusOr<AgentSession*> Session();
  // After a failed attempt: drops the session; returns true (after sleeping the backoff) when `s`
  // is transient and the budget allows another attempt, false when the caller should give up.
  bool ShouldRetry(const Status& s);
  // The error to report after ShouldRetry returned false for `s`.
  Status GiveUp(const Status& s) const;

  std::unique_ptr<AgentSession> session_;
  SessionFactory factory_;
  RetryPolicy policy_;
  int attempts_ = 0;
  int reconnects_ = 0;
  Clock::TimePoint since_;
  std::string host_;
};

// The reconnectors of one parallel transfer's connections (range pulls, range uploads): the first is
// the caller's; each later one is made from its factory and retry policy and connects when first used.
// Fold() adds the later ones' reconnects to the first's (their own first connection is not one); call
// it once their users are done. Thread safety: one thread adds and folds; each reconnector it hands out
// is used by one thread at a time.
class ConnectionSet {
 public:
  explicit ConnectionSet(Reconnector* first) : first_(first) {}
  // The first call returns the caller's reconnector, later calls new ones (owned here).
  Reconnector* Add();
  // How many Add() handed out.
  int size() const { return added_; }
  void Fold();

 private:
  Reconnector* first_;
  int added_ = 0;
  std::vector<std::unique_ptr<Reconnector>> extra_;
};

// Runs `call` through rc->Run: retrying transient failures, its success counting as progress.
// `call` must be idempotent.
Status WithRetry(Reconnector* rc, const std::function<Status(AgentSession&)>& call);

// "note: resumed after N reconnect(s) to HOST" on stderr, when the connection was resumed at all.
void NoteReconnects(const Reconnector& rc);

// GetJob through WithRetry. Errors name the host and the job (NOT_FOUND: no such job there).
Status GetJob(Reconnector* rc, const std::string& id, v1::Job* job);
// ListJobs through WithRetry: every job the agent knows. Errors name the host.
Status ListJobs(Reconnector* rc, v1::ListJobsResponse* jobs);

}  // namespace sftctl::client
