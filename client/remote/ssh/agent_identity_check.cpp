#include "client/remote/ssh/agent_identity_check.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>

#include "common/agent_identity.h"

namespace sftctl::client {
namespace {

// "[::1]:41234" and "::1:41234" name the same address.
std::string WithoutBrackets(std::string addr) {
  addr.erase(std::remove_if(addr.begin(), addr.end(), [](char c) { return c == '[' || c == ']'; }),
             addr.end());
  return addr;
}

}  // namespace

Status CheckAgentIdentity(const AgentConnection& conn, const std::string& expected_addr, bool allow_legacy,
                          int timeout_s, const std::string& context) {
  const std::string not_sent = "; the agent token was not sent";
  SFT_ASSIGN_OR_RETURN(std::string challenge, RandomBytes(32));
  v1::IdentifyRequest req;
  req.set_challenge(challenge);
  v1::IdentifyResponse resp;
  grpc::ClientContext ctx;  // no authorization metadata: that is the point
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(std::max(1, timeout_s)));
  grpc::Status gs = conn.NewStub()->Identify(&ctx, req, &resp);
  if (gs.error_code() == grpc::StatusCode::UNIMPLEMENTED && allow_legacy) {
    // Once per process (reconnects would repeat it); connections on several threads may get here.
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      std::cerr << "warning: " << context << ": the agent predates Identify and cannot prove itself before "
                << "it receives its token; update the host with `sftctl bootstrap`\n";
    }
    return OkStatus();
  }
  if (!gs.ok()) {
    return UnavailableError(context + ": the server at " + expected_addr +
                            " did not answer Identify(): " + gs.error_message() + not_sent);
  }
  if (WithoutBrackets(resp.addr()) != WithoutBrackets(expected_addr) ||
      !VerifyAgentIdentity(conn.token(), resp.addr(), challenge, resp.proof())) {
    return PermissionDeniedError(context + ": the server at " + expected_addr +
                                 " did not prove that it is the agent (another program may have taken the "
                                 "agent's port)" +
                                 not_sent);
  }
  return OkStatus();
}

}  // namespace sftctl::client
