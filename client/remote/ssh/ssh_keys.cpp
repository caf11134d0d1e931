#include "client/remote/ssh/ssh_keys.h"

#include <cstdint>
#include <fstream>
#include <sstream>

namespace sftctl::client::ssh {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string ReadSmall(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return "";
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str().substr(0, 1 << 20);
}

// Reads an SSH "string" (uint32 length + bytes) at *pos.
bool ReadString(std::string_view b, size_t* pos, std::string_view* out) {
  if (*pos + 4 > b.size()) return false;
  uint32_t n = (uint32_t(uint8_t(b[*pos])) << 24) | (uint32_t(uint8_t(b[*pos + 1])) << 16) |
               (uint32_t(uint8_t(b[*pos + 2])) << 8) | uint32_t(uint8_t(b[*pos + 3]));
  *pos += 4;
  if (n > b.size() - *pos) return false;
  *out = b.substr(*pos, n);
  *pos += n;
  return true;
}

// The base64 body between the BEGIN/END lines of an "OPENSSH PRIVATE KEY", decoded.
std::string OpensshKeyBody(const std::string& text) {
  const std::string begin = "-----BEGIN OPENSSH PRIVATE KEY-----", end = "-----END OPENSSH PRIVATE KEY-----";
  size_t b = text.find(begin), e = text.find(end);
  if (b == std::string::npos || e == std::string::npos || e < b) return "";
  auto body = Base64Decode(std::string_view(text).substr(b + begin.size(), e - b - begin.size()));
  return body.ok() ? *body : "";
}

}  // namespace

std::string Base64Encode(std::string_view data, bool pad) {
  std::string out;
  out.reserve((data.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < data.size(); i += 3) {
    uint32_t v =
        (uint32_t(uint8_t(data[i])) << 16) | (uint32_t(uint8_t(data[i + 1])) << 8) | uint8_t(data[i + 2]);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i < data.size()) {
    uint32_t v = uint32_t(uint8_t(data[i])) << 16;
    if (i + 1 < data.size()) v |= uint32_t(uint8_t(data[i + 1])) << 8;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    if (i + 1 < data.size()) {
      out += kAlphabet[(v >> 6) & 63];
      if (pad) out += '=';
    } else if (pad) {
      out += "==";
    }
  }
  return out;
}

StatusOr<std::string> Base64Decode(std::string_view text) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=' || c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    const char* p = nullptr;
    for (const char* a = kAlphabet; *a; ++a) {
      if (*a == c) {
        p = a;
        break;
      }
    }
    if (p == nullptr) return InvalidArgumentError("bad base64 character");
    acc = (acc << 6) | uint32_t(p - kAlphabet);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

std::string FingerprintFromDigest(std::string_view sha256_digest) {
  return "SHA256:" + Base64Encode(sha256_digest, /*pad=*/false);
}

std::string KeyTypeOfBlob(std::string_view blob) {
  size_t pos = 0;
  std::string_view type;
  if (!ReadString(blob, &pos, &type)) return "";
  return std::string(type);
}

std::string KeyTypeOfFile(const std::string& path) {
  std::string pub = ReadSmall(path + ".pub");
  if (!pub.empty()) {
    std::istringstream ss(pub);
    std::string type;
    ss >> type;
    if (!type.empty()) return type;
  }
  std::string text = ReadSmall(path);
  if (text.find("BEGIN RSA PRIVATE KEY") != std::string::npos) return "ssh-rsa";
  if (text.find("BEGIN EC PRIVATE KEY") != std::string::npos) return "ecdsa-sha2";
  if (text.find("BEGIN DSA PRIVATE KEY") != std::string::npos) return "ssh-dss";
  // openssh-key-v1: magic, cipher, kdf, kdf options, number of keys, then the first public key blob.
  std::string body = OpensshKeyBody(text);
  const std::string magic("openssh-key-v1\0", 15);
  if (body.compare(0, magic.size(), magic) != 0) return "";
  size_t pos = magic.size();
  std::string_view cipher, kdf, kdfopts, pubkey;
  if (!ReadString(body, &pos, &cipher) || !ReadString(body, &pos, &kdf) ||
      !ReadString(body, &pos, &kdfopts)) {
    return "";
  }
  pos += 4;  // number of keys
  if (!ReadString(body, &pos, &pubkey)) return "";
  return KeyTypeOfBlob(pubkey);
}

bool KeyFileIsEncrypted(const std::string& path) {
  std::string text = ReadSmall(path);
  if (text.find("ENCRYPTED") != std::string::npos) return true;  // PEM "Proc-Type: 4,ENCRYPTED"
  std::string body = OpensshKeyBody(text);
  const std::string magic("openssh-key-v1\0", 15);
  if (body.compare(0, magic.size(), magic) != 0) return false;
  size_t pos = magic.size();
  std::string_view cipher;
  return ReadString(body, &pos, &cipher) && cipher != "none";
}

}  // namespace sftctl::client::ssh
