#include "client/remote/agent_session.h"

#include <algorithm>
#include <iostream>

#include "client/remote/local_agent.h"
#include "client/remote/ssh/remote_agent.h"

namespace sftctl::client {

StatusOr<std::unique_ptr<AgentConnection>> ConnectToAgent(const ConnectOptions& opts) {
  if (IsLocalAgentHost(opts.host)) return ConnectLocalAgent(opts);
  return ConnectOverSsh(opts);
}

AgentSession::AgentSession(std::unique_ptr<AgentConnection> conn)
    : conn_(std::move(conn)),
      stub_(conn_->NewStub()),
      token_(conn_->token()),
      host_(conn_->host()),
      description_(conn_->description()) {}

AgentSession::AgentSession(std::unique_ptr<v1::Agent::StubInterface> stub, std::string token,
                           std::string host)
    : stub_(std::move(stub)), token_(std::move(token)), host_(host), description_(std::move(host)) {}

void AgentSession::Prepare(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) const {
  ctx->AddMetadata("authorization", "Bearer " + token_);
  if (timeout.count() > 0) ctx->set_deadline(std::chrono::system_clock::now() + timeout);
}

SessionFactory MakeSessionFactory(const ConnectOptions& options) {
  ConnectOptions opts = options;
  if (!opts.known_agents) opts.known_agents = NewKnownAgents();  // shared by this factory's connections
  return [opts]() -> StatusOr<std::unique_ptr<AgentSession>> {
    auto conn = ConnectToAgent(opts);
    if (!conn.ok()) return conn.status();
    return std::make_unique<AgentSession>(std::move(*conn));
  };
}

Status FromGrpc(const grpc::Status& s, const std::string& context) {
  if (s.ok()) return OkStatus();
  std::string msg = s.error_message();
  if (msg.empty()) msg = "gRPC error " + std::to_string(static_cast<int>(s.error_code()));
  return Status(static_cast<StatusCode>(s.error_code()), context.empty() ? msg : context + ": " + msg);
}

bool IsTransient(const Status& s) {
  switch (s.code()) {
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kInternal:
    case StatusCode::kUnknown:
    case StatusCode::kCancelled:
    case StatusCode::kAborted:
      return true;
    default:
      return false;
  }
}

Reconnector::Reconnector(std::unique_ptr<AgentSession> first, SessionFactory factory, RetryPolicy policy)
    : session_(std::move(first)),
      factory_(std::move(factory)),
      policy_(policy),
      since_(policy_.clock->Now()) {
  if (session_) host_ = session_->host();
}

StatusOr<AgentSession*> Reconnector::Session() {
  if (!session_) {
    auto s = factory_();
    if (!s.ok()) return s.status();
    session_ = std::move(*s);
    host_ = session_->host();
    ++reconnects_;
  }
  return session_.get();
}

bool Reconnector::ShouldRetry(const Status& s) {
  session_.reset();
  if (!IsTransient(s)) return false;
  ++attempts_;
  const auto now = policy_.clock->Now();
  if (attempts_ >= policy_.max_attempts || now - since_ >= policy_.max_time) return false;
  auto backoff = policy_.initial_backoff * (1 << std::min(attempts_ - 1, 10));
  backoff = std::min(backoff, policy_.max_backoff);
  policy_.clock->SleepFor(backoff);
  return true;
}

void Reconnector::MadeProgress() {
  attempts_ = 0;
  since_ = policy_.clock->Now();
}

Status Reconnector::GiveUp(const Status& s) const {
  if (!IsTransient(s) || attempts_ == 0) return s;
  return Status(StatusCode::kUnavailable, "lost the connection to " + (host_.empty() ? "the agent" : host_) +
                                              " and could not resume after " + std::to_string(attempts_) +
                                              " attempt(s): " + s.message());
}

Reconnector* ConnectionSet::Add() {
  if (added_++ == 0) return first_;
  extra_.push_back(std::make_unique<Reconnector>(nullptr, first_->factory(), first_->policy()));
  return extra_.back().get();
}

void ConnectionSet::Fold() {
  for (auto& rc : extra_) first_->AddReconnects(std::max(0, rc->reconnects() - 1));
  extra_.clear();
}

Status Reconnector::Run(const std::function<Attempt(AgentSession&)>& attempt) {
  for (;;) {
    auto session = Session();
    Attempt a = session.ok() ? attempt(**session) : Attempt{session.status()};
    if (a.progressed) MadeProgress();
    if (a.status.ok() || a.final) return a.status;
    if (!ShouldRetry(a.status)) return GiveUp(a.status);
  }
}

Status WithRetry(Reconnector* rc, const std::function<Status(AgentSession&)>& call) {
  return rc->Run([&](AgentSession& a) {
    Status s = call(a);
    return Attempt{s, false, s.ok()};
  });
}

void NoteReconnects(const Reconnector& rc) {
  if (rc.reconnects() > 0)
    std::cerr << "note: resumed after " << rc.reconnects() << " reconnect(s) to " << rc.host() << "\n";
}

Status GetJob(Reconnector* rc, const std::string& id, v1::Job* job) {
  return WithRetry(rc, [&](AgentSession& a) {
    grpc::ClientContext ctx;
    a.Prepare(&ctx);
    v1::GetJobRequest req;
    req.set_job_id(id);
    return FromGrpc(a.stub()->GetJob(&ctx, req, job), a.host() + ": " + id);
  });
}

Status ListJobs(Reconnector* rc, v1::ListJobsResponse* jobs) {
  return WithRetry(rc, [&](AgentSession& a) {
    grpc::ClientContext ctx;
    a.Prepare(&ctx);
    return FromGrpc(a.stub()->ListJobs(&ctx, v1::ListJobsRequest(), jobs), a.host() + ": list");
  });
}

}  // namespace sftctl::client
