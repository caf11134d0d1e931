#include "common/agent_identity.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace sftctl {

std::string AgentIdentityProof(std::string_view token, std::string_view addr, std::string_view challenge) {
  std::string message = "sftd-identify-v1\n";
  message.append(addr);
  message += '\n';
  message.append(challenge);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &len) == nullptr) {
    return std::string();  // never verifies: VerifyAgentIdentity wants 32 bytes
  }
  return std::string(reinterpret_cast<const char*>(out), len);
}

bool VerifyAgentIdentity(std::string_view token, std::string_view addr, std::string_view challenge,
                         std::string_view proof) {
  const std::string want = AgentIdentityProof(token, addr, challenge);
  return want.size() == 32 && proof.size() == want.size() &&
         CRYPTO_memcmp(want.data(), proof.data(), want.size()) == 0;
}

StatusOr<std::string> RandomBytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    return InternalError("the system's random source failed (RAND_bytes)");
  }
  return out;
}

}  // namespace sftctl
