#include "common/object_store/manifest_key.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

namespace sftctl {
namespace {

constexpr std::string_view kSignaturePrefix = "hmac-sha256:";

std::string HmacSha256(std::string_view key, std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), md, &n);
  return std::string(reinterpret_cast<const char*>(md), n);
}

std::string Hex(std::string_view bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

}  // namespace

std::string DeriveRunKey(std::string_view master_key, std::string_view s3_url) {
  return HmacSha256(master_key, "sftctl checkpoint key v1\n" + std::string(s3_url));
}

std::string SignManifest(std::string_view run_key, std::string_view unsigned_json) {
  return std::string(kSignaturePrefix) + Hex(HmacSha256(run_key, unsigned_json));
}

bool SignatureMatches(std::string_view run_key, std::string_view unsigned_json, std::string_view signature) {
  const std::string want = SignManifest(run_key, unsigned_json);
  return signature.size() == want.size() && CRYPTO_memcmp(signature.data(), want.data(), want.size()) == 0;
}

}  // namespace sftctl
