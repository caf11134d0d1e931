#include "agent/serving/activity_interceptor.h"

#include <cstring>
#include <string>

#include "sftctl/v1/agent.pb.h"

namespace sftctl::agent {
namespace {

constexpr char kPullMethod[] = "/sftctl.v1.Agent/PullArtifact";

class ActivityInterceptor final : public grpc::experimental::Interceptor {
 public:
  ActivityInterceptor(grpc::experimental::ServerRpcInfo* info, ClientActivity* activity,
                      const Authenticator* auth)
      : activity_(activity), auth_(auth), is_pull_(std::strcmp(info->method(), kPullMethod) == 0) {}
  ~ActivityInterceptor() override {
    if (counted_) activity_->CallEnded();
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    using H = grpc::experimental::InterceptionHookPoints;
    if (m->QueryInterceptionHookPoint(H::POST_RECV_INITIAL_METADATA)) NoteCall(m);
    if (counted_ && is_pull_ && m->QueryInterceptionHookPoint(H::POST_RECV_MESSAGE)) {
      if (const auto* req = static_cast<const ::sftctl::v1::PullArtifactRequest*>(m->GetRecvMessage());
          req != nullptr && ClientActivity::IsDoneMarker(req->path())) {
        job_ = req->job_id();
        path_ = req->path();
      }
    }
    if (!path_.empty() && m->QueryInterceptionHookPoint(H::PRE_SEND_STATUS) && m->GetSendStatus().ok()) {
      activity_->NotePulled(job_, path_);
    }
    m->Proceed();
  }

 private:
  void NoteCall(grpc::experimental::InterceptorBatchMethods* m) {
    const auto* md = m->GetRecvInitialMetadata();
    if (md == nullptr) return;
    auto it = md->find("authorization");
    const bool present = it != md->end();
    const std::string value = present ? std::string(it->second.data(), it->second.size()) : std::string();
    if (!auth_->CheckHeader(value, present).ok()) return;
    counted_ = true;
    activity_->CallStarted();
  }

  ClientActivity* activity_;
  const Authenticator* auth_;
  const bool is_pull_;
  bool counted_ = false;
  std::string job_, path_;
};

class ActivityFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  ActivityFactory(ClientActivity* activity, const Authenticator* auth) : activity_(activity), auth_(auth) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new ActivityInterceptor(info, activity_, auth_);
  }

 private:
  ClientActivity* activity_;
  const Authenticator* auth_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeClientActivityInterceptors(
    ClientActivity* activity, const Authenticator* auth) {
  return std::make_unique<ActivityFactory>(activity, auth);
}

}  // namespace sftctl::agent
