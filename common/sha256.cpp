#include "common/sha256.h"

#include <openssl/evp.h>

#include <algorithm>
#include <vector>

#include "common/os/file_system.h"

namespace sftctl {

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : impl_(new Impl) {
  impl_->ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr);
}

Sha256::~Sha256() { EVP_MD_CTX_free(impl_->ctx); }

void Sha256::Update(std::string_view data) { Update(data.data(), data.size()); }

void Sha256::Update(const void* data, size_t size) {
  if (size > 0) EVP_DigestUpdate(impl_->ctx, data, size);
}

std::string Sha256::HexDigest() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(impl_->ctx, md, &len);
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(len * 2);
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 15]);
  }
  return out;
}

std::string Sha256Hex(std::string_view data) {
  Sha256 h;
  h.Update(data);
  return h.HexDigest();
}

StatusOr<std::string> Sha256File(const std::string& path) {
  Sha256 h;
  SFT_RETURN_IF_ERROR(ForEachChunk(path, 1 << 20, [&h](std::string_view chunk) { h.Update(chunk); }));
  return h.HexDigest();
}

StatusOr<std::string> Sha256FilePrefix(int fd, uint64_t size, const std::string& path) {
  Sha256 h;
  SFT_RETURN_IF_ERROR(Sha256UpdateFromFile(fd, size, path, &h));
  return h.HexDigest();
}

Status Sha256UpdateFromFile(int fd, uint64_t size, const std::string& path, Sha256* h) {
  std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(size, 1 << 20)));
  for (uint64_t pos = 0; pos < size;) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - pos));
    SFT_RETURN_IF_ERROR(PreadFully(fd, buf.data(), want, pos, path));
    h->Update(buf.data(), want);
    pos += want;
  }
  return OkStatus();
}

bool IsSha256Hex(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace sftctl
