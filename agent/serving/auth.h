// Auth: the agent's bearer token. Created on first start as a 0600 file of 64 hex digits (256 random
// bits); every RPC must carry "authorization: Bearer <token>".
//
// Thread safety: Authenticator is immutable after construction and safe for concurrent use.
#pragma once

#include <string>

#include "common/status.h"
#include "proto/grpc_compat.h"

namespace sftctl::agent {

// Reads the token at `path`, creating it (mode 0600, O_EXCL) when missing. Refuses (PERMISSION_DENIED)
// a token file readable or writable by group or others, or owned by another user.
StatusOr<std::string> LoadOrCreateToken(const std::string& path);

class Authenticator {
 public:
  explicit Authenticator(std::string token) : token_(std::move(token)) {}
  // OK when the metadata carries the right bearer token (compared in constant time); otherwise
  // UNAUTHENTICATED saying whether the token was missing, malformed or wrong.
  Status Check(const rpc::ServerContextBase& ctx) const;
  Status CheckHeader(const std::string& header_value, bool present) const;
  // The Identify proof for `addr` and `challenge` (common/agent_identity.h): shows a client that
  // this agent knows the token without revealing it.
  std::string Prove(const std::string& addr, const std::string& challenge) const;

 private:
  std::string token_;
};

}  // namespace sftctl::agent
