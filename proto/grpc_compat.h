// The gRPC callback server API under one set of names, and working, whichever gRPC the agent is built
// against: Debian 12's 1.51, and the 1.30 of Ubuntu 22.04 and Debian 11, hosts `sftctl bootstrap`
// builds on. proto/CMakeLists.txt defines SFTCTL_GRPC_OLD_MINOR (the x of gRPC 1.x) before 1.37
// only; 1.30's headers carry no version macro.
//
//   - Before 1.32 the callback API lives in grpc::experimental only (grpc::ServerContextBase too), and
//     the generated base class is Service::ExperimentalCallbackService. The agent uses the names below.
//   - Before 1.37 gRPC runs a callback service's I/O only on a poller that runs "in the background",
//     which Linux's (epollex, epoll1) do not: nothing reads the server's sockets and every RPC times
//     out. CallbackServerPoller drives a completion queue of the server from a thread of its own
//     (gRPC 1.37 does the same inside, grpc/grpc#25169), and UseServerPollingEngine picks the engine
//     under which that thread polls every socket: epoll1 (under 1.30's default, epollex, and under
//     poll, it polls none of them).
#pragma once

#include <grpcpp/completion_queue.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/server_callback.h>

#include <cstdlib>
#include <memory>
#include <thread>

namespace sftctl::rpc {

#if defined(SFTCTL_GRPC_OLD_MINOR) && SFTCTL_GRPC_OLD_MINOR < 32
namespace callback = ::grpc::experimental;
// The generated callback service of `Service` (e.g. CallbackService<::sftctl::v1::Agent>).
template <typename Service>
using CallbackService = typename Service::ExperimentalCallbackService;
#else
namespace callback = ::grpc;
template <typename Service>
using CallbackService = typename Service::CallbackService;
#endif

using CallbackServerContext = callback::CallbackServerContext;
using ServerContextBase = callback::ServerContextBase;
using ServerUnaryReactor = callback::ServerUnaryReactor;
template <typename Response>
using ServerWriteReactor = callback::ServerWriteReactor<Response>;
template <typename Request>
using ServerReadReactor = callback::ServerReadReactor<Request>;

// Before gRPC is first used in a process that serves (it reads the setting once): where gRPC is older
// than 1.37, sets GRPC_POLL_STRATEGY=epoll1, the one engine under which CallbackServerPoller works.
inline void UseServerPollingEngine() {
#if defined(SFTCTL_GRPC_OLD_MINOR) && SFTCTL_GRPC_OLD_MINOR < 37
  ::setenv("GRPC_POLL_STRATEGY", "epoll1", 1);
#endif
}

// Polls a callback server's sockets where gRPC does not (before 1.37); does nothing elsewhere.
// Outlive the server (declare it first):
//   rpc::CallbackServerPoller poller;  std::unique_ptr<grpc::Server> server;
//   poller.AddTo(&builder);  server = builder.BuildAndStart();  poller.Start();
//   ... server->Shutdown(); server->Wait(); server.reset();  (~CallbackServerPoller stops it)
class CallbackServerPoller {
 public:
  CallbackServerPoller() = default;
  CallbackServerPoller(const CallbackServerPoller&) = delete;
  CallbackServerPoller& operator=(const CallbackServerPoller&) = delete;
  ~CallbackServerPoller() { Stop(); }

  // Before builder->BuildAndStart().
  void AddTo(grpc::ServerBuilder* builder) {
#if defined(SFTCTL_GRPC_OLD_MINOR) && SFTCTL_GRPC_OLD_MINOR < 37
    cq_ = builder->AddCompletionQueue();
#else
    (void)builder;
#endif
  }
  // Once the server has started.
  void Start() {
    if (cq_ == nullptr || thread_.joinable()) return;
    thread_ = std::thread([cq = cq_.get()] { Drain(cq); });
  }
  // After the server's Shutdown: shuts the queue down and waits until it is drained. (The queue
  // itself goes with this object, after the server.)
  void Stop() {
    if (cq_ == nullptr || stopped_) return;
    stopped_ = true;
    cq_->Shutdown();
    if (thread_.joinable()) {
      thread_.join();
    } else {
      Drain(cq_.get());
    }
  }

 private:
  static void Drain(grpc::ServerCompletionQueue* cq) {
    void* tag = nullptr;
    bool ok = false;
    while (cq->Next(&tag, &ok)) {
    }
  }

  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace sftctl::rpc
