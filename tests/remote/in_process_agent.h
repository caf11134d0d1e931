// A Reconnector for the client tests that run a fake agent in process (real gRPC, no sockets): each
// session is a stub on a new in-process channel of the server, as each reconnect or extra pull stream
// is a new connection in real use.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>

#include "client/agent_session.h"

namespace sftctl::remotetest {

// Fast retries (1 ms backoff, `max_attempts`); `connects`, when given, counts the sessions made.
inline std::unique_ptr<client::Reconnector> InProcessReconnector(grpc::Server* server, int max_attempts,
                                                                 std::atomic<int>* connects = nullptr) {
  client::RetryPolicy p;
  p.initial_backoff = std::chrono::milliseconds(1);
  p.max_attempts = max_attempts;
  auto factory = [server, connects]() -> StatusOr<std::unique_ptr<client::AgentSession>> {
    if (connects != nullptr) ++*connects;
    grpc::ChannelArguments args;
    return std::make_unique<client::AgentSession>(
        ::sftctl::v1::Agent::NewStub(server->InProcessChannel(args)), "token", "fake");
  };
  auto first = factory();
  return std::make_unique<client::Reconnector>(std::move(*first), factory, p);
}

}  // namespace sftctl::remotetest
