// The gRPC server interceptor that feeds ClientActivity (agent/stopping/client_activity.h) for every
// RPC, so no handler changes: a call whose bearer token the Authenticator accepts is counted while it
// is open, and a PullArtifact that sent a checkpoint's DONE marker whole is noted.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>

#include "agent/serving/auth.h"
#include "agent/stopping/client_activity.h"

namespace sftctl::agent {

// The interceptor factory to register on the grpc::ServerBuilder: calls whose bearer token `auth`
// accepts count as client activity. `activity` and `auth` must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeClientActivityInterceptors(
    ClientActivity* activity, const Authenticator* auth);

}  // namespace sftctl::agent
