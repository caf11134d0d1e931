// InProcessAgent: a fake agent (a test's own v1::Agent service) served in process for the client
// tests (real gRPC, no sockets), and the Reconnectors that reach it: each session is a stub on a new
// in-process channel, as each reconnect or extra pull stream is a new connection in real use. A test
// fixture holds one after its fake service (so that it shuts down first) and starts it in SetUp:
//
//   FakeAgent agent_;
//   testing::InProcessAgent server_;
//   void SetUp() override { ASSERT_TRUE(server_.Start(&agent_)); }
//   ... auto rc = server_.NewReconnector(3); ... EXPECT_EQ(server_.connects(), 1);
//
// Thread safety: Start before the first NewReconnector; the Reconnectors may then make sessions from
// several threads (connects() is atomic). The server shuts down when the object is destroyed.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>

#include "client/remote/agent_session.h"

namespace sftctl::testing {

class InProcessAgent {
 public:
  InProcessAgent() = default;
  InProcessAgent(const InProcessAgent&) = delete;
  InProcessAgent& operator=(const InProcessAgent&) = delete;
  ~InProcessAgent() {
    if (server_ != nullptr) server_->Shutdown();
  }

  // Serves `service` (REQUIRES: it outlives this object). False when gRPC could not start the server.
  [[nodiscard]] bool Start(grpc::Service* service) {
    grpc::ServerBuilder b;
    b.RegisterService(service);
    server_ = b.BuildAndStart();
    return server_ != nullptr;
  }

  // A Reconnector with fast retries (1 ms backoff, `max_attempts`), connected once already; every
  // session it makes counts in connects(). REQUIRES: Start succeeded.
  std::unique_ptr<client::Reconnector> NewReconnector(int max_attempts) {
    client::RetryPolicy p;
    p.initial_backoff = std::chrono::milliseconds(1);
    p.max_attempts = max_attempts;
    auto factory = [this]() -> StatusOr<std::unique_ptr<client::AgentSession>> {
      ++connects_;
      grpc::ChannelArguments args;
      return std::make_unique<client::AgentSession>(
          ::sftctl::v1::Agent::NewStub(server_->InProcessChannel(args)), "token", "fake");
    };
    auto first = factory();
    return std::make_unique<client::Reconnector>(std::move(*first), factory, p);
  }

  // Sessions made so far by this agent's Reconnectors.
  int connects() const { return connects_.load(); }

 private:
  std::unique_ptr<grpc::Server> server_;
  std::atomic<int> connects_{0};
};

}  // namespace sftctl::testing
