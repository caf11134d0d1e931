// The proof with which an agent shows a client that it knows the client's token before the client
// sends it (proto Identify; docs/ssh.md, "Trust"). A proof binds the agent's own listen address, so a
// server on another port that relays the challenge to the real agent gets a proof that names the
// agent's address, not the one the client dialled.
//
// Thread safety: free functions, reentrant.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace sftctl {

// Challenges are 16..64 bytes; the client makes 32 random ones per connection.
inline constexpr size_t kIdentifyChallengeMin = 16;
inline constexpr size_t kIdentifyChallengeMax = 64;

// HMAC-SHA256(key = token, "sftd-identify-v1\n" + addr + "\n" + challenge): 32 raw bytes.
std::string AgentIdentityProof(std::string_view token, std::string_view addr, std::string_view challenge);

// True when `proof` is AgentIdentityProof(token, addr, challenge); compared in constant time.
bool VerifyAgentIdentity(std::string_view token, std::string_view addr, std::string_view challenge,
                         std::string_view proof);

// `n` bytes from the system's cryptographic random source. Errors: INTERNAL when it fails.
StatusOr<std::string> RandomBytes(size_t n);

}  // namespace sftctl
